"""What the tokenizer tests share (test_tokenizers, test_bpe, test_subword): GPT-2's end-of-text
token, a strategy for any assigned Unicode character, and a guard against hangs."""

from __future__ import annotations

import threading

from hypothesis import strategies as st

END = "<|endoftext|>"

# Characters assigned in Python's Unicode database: newer ones are letters to `regex` but not
# yet to the Rust library's older tables.
ASSIGNED = st.characters(exclude_categories=("Cs", "Cn"))


def finishes(call, seconds: float = 10.0):
    """Run `call` in a thread; fail if it has not returned or raised within `seconds` (a former
    hang), else return what it returned or raise what it raised."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed back to the test below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
