"""SGLang's own readings of the size strings its environment and configuration take.

Two spellings coexist: Mooncake's segment size ("4gb" is 4 GiB, a bare number bytes) and the file
backend's sizes (SI "200G", IEC "1Gi", case-sensitive). A value SGLang would refuse, or silently
ignore and so leave a tier uncapped, is refused here with the name it was given under.
"""

from __future__ import annotations

import re
from decimal import Decimal

from supervisor.core.host_consumers import ConsumerError
from supervisor.core.units import GiB


def segment_bytes(value: object, name: str) -> int:
    """Mooncake's global segment size as `_parse_global_segment_size` reads it: "Ngb" is N GiB,
    a bare number is bytes (mem_cache/storage/mooncake_store/mooncake_store.py:80-92)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = str(value).strip().lower()
        try:
            number = int(text[:-2].strip()) * GiB if text.endswith("gb") else int(text)
        except ValueError:
            raise ConsumerError(
                f'{name}={value!r}: SGLang reads an integer of bytes or "<N>gb" (GiB), '
                "and its Mooncake store would not start"
            ) from None
    if number < 0:
        raise ConsumerError(f"{name}={value!r}: must not be negative")
    return number


_HUMAN_SIZE = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def file_size_bytes(value: object, name: str) -> int:
    """A file-backend size as SGLang reads it, 0 meaning none: "200G" is SI, "1Gi" IEC,
    case-sensitive (mem_cache/storage/file/lru_file_evictor.py:39-55 over utils/common.py:3394-3429
    human_readable_int).

    Raises:
        ConsumerError: a value SGLang would ignore with a warning, leaving the cap off.
    """
    if value is None or isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        number = int(value)
    else:
        text = str(value).strip()
        if not text or text == "0":
            return 0
        number = _human_int(text, name)
    if number < 0:
        raise ConsumerError(f"{name}={value!r}: must not be negative (SGLang would drop the cap)")
    return number


def _human_int(text: str, name: str) -> int:
    problem = f"{name}={text!r}: SGLang would ignore it and leave the file backend uncapped"
    match = _HUMAN_SIZE.fullmatch(text)
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise ConsumerError(f"{problem} (write 200G, 1Gi or a number of bytes)") from None
    number, suffix = match.groups()
    if suffix in _IEC:
        if "." in number:
            raise ConsumerError(f"{problem} (decimals only with SI suffixes like 1.5G)")
        return int(number) * _IEC[suffix]
    return int(Decimal(number) * _SI[suffix])
