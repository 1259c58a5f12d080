"""Long text cut to a bound: head and tail kept, the mark says how much is missing."""

from __future__ import annotations

from supervisor.core.clip import clip, cut_mark, cut_marks


def test_text_within_the_bound_is_unchanged():
    assert clip("a" * 100, 100) == "a" * 100


def test_longer_text_keeps_three_quarters_head_one_quarter_tail():
    text = "h" * 600 + "t" * 600
    out = clip(text, 400)
    assert out == "h" * 300 + " …[cut 800 chars]… " + "t" * 100
    assert cut_marks(out) == [(300, 300 + len(cut_mark(800, "chars")))]


def test_text_without_a_mark_has_none():
    assert cut_marks("[cut 5 bytes] is not a mark without its ellipses") == []
