"""Which names hold secrets: of environment variables, of flags, of mapping keys.

A name is secret when one of its words (split at anything but a letter or a digit: `_`, `-`,
`.`) is KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL(S) or APIKEY, or it ends in APIKEY:
HF_TOKEN, AWS_SECRET_ACCESS_KEY, api_key, --ssl-keyfile-password, --hf-token are;
TOKENIZERS_PARALLELISM, --tokenizer-path, --max-total-tokens, --ssl-keyfile (a path) are not.
Whole words, not substrings: that is what tells a key from a keyfile and a token from a
tokenizer.
"""

from __future__ import annotations

import re

SECRET_NAME_PARTS = frozenset(
    {"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
)
_WORD_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    parts = {part for part in _WORD_SEPARATORS.split(upper) if part}
    return bool(parts & SECRET_NAME_PARTS) or upper.endswith("APIKEY")
