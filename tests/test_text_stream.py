from quickdraft.serve.text import TextStream

WORDS = ["Hel", "lo", " wor", "ld", "! ", "STO", "P", " more"]


def decode(ids: list[int]) -> str:
    return "".join(WORDS[i] for i in ids)


def stream(stops: list[str], upto: int) -> tuple[str, TextStream]:
    text = TextStream(decode, stops)
    sent = "".join(text.delta(list(range(n))) for n in range(1, upto + 1))
    return sent, text


def test_deltas_add_up_to_the_text_without_stops():
    sent, text = stream([], len(WORDS))
    assert sent == decode(list(range(len(WORDS))))
    assert text.final(sent) == ""


def test_text_a_stop_string_may_claim_is_held_back_and_never_sent():
    sent, text = stream(["STOP"], 7)  # the stop string is complete after token 6
    assert sent == "Hello world! "
    assert sent + text.final("Hello world! ") == "Hello world! "
    partial, _ = stream(["STOP"], 6)  # "STO" could still become the stop string
    assert not partial.endswith("S") and not partial.endswith("STO")


def test_a_partial_character_waits_for_its_other_bytes():
    text = TextStream(lambda ids: "ab\ufffd" if len(ids) == 1 else "abc", [])
    assert text.delta([1]) == "ab"
    assert text.delta([1, 2]) == "c"
