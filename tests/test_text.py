"""TextStream: incremental detokenizing, stop strings and streaming deltas, on real and fake tokenizers."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from quickdraft.errors import QuickdraftError
from quickdraft.text import TextStream

Decode = Callable[[list[int]], str]

SENTENCES = [
    "héllo wörld 你好 🙂",
    "The quick brown fox jumps over the lazy dog.",
    "Ça va? Größe, naïve café, déjà vu. 日本語のテキスト。",
    "你好，世界！我们今天去公园散步吧。🙂👍🏽🎉",
    "Speculative decoding drafts tokens and the target verifies them.",
    "ελληνικά, русский текст, 한국어 텍스트, emoji 🙂🙂 and more.",
]
ASCII_SENTENCES = [s for s in SENTENCES if s.isascii()] + ["hello world, the target and the draft agree often."]
POOL = "".join(sorted(set("".join(SENTENCES)))) + "\n\n  "  # characters for random texts


# --- tokenizers ---------------------------------------------------------------------------------------


def byte_level_bpe() -> Tokenizer:
    """GPT-2 style: bytes mapped to characters, so tokens may end in the middle of a UTF-8 character."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<eos>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(SENTENCES * 10, trainer)
    return tokenizer


def byte_fallback_bpe() -> Tokenizer:
    """Llama/SentencePiece style: '▁' for spaces, <0xNN> tokens for characters not in the vocab, and the
    first token's leading space stripped (so decoding a window is not decoding a prefix of the text)."""
    ascii_only = Tokenizer(models.BPE(unk_token="<unk>"))
    ascii_only.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    ascii_only.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    ascii_only.train_from_iterator(ASCII_SENTENCES * 10, trainer)
    trained = json.loads(ascii_only.to_str())["model"]
    vocab = dict(trained["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = ascii_only.normalizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tokenizer


def decoder_of(tokenizer: Tokenizer) -> Decode:
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def fake_bytes(pieces: list[bytes], special: frozenset[int] = frozenset()) -> Decode:
    """A byte-level tokenizer in miniature: each id is some bytes; specials decode to nothing."""
    return lambda ids: b"".join(pieces[i] for i in ids if i not in special).decode("utf-8", "replace")


WORDS = ["Hel", "lo", " wor", "ld", "! ", "STO", "P", " more"]


def words(ids: list[int]) -> str:
    return "".join(WORDS[i] for i in ids)


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    return byte_level_bpe()


@pytest.fixture(scope="module")
def byte_fallback() -> Tokenizer:
    return byte_fallback_bpe()


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    """The embedded default target's tokenizer (SmolLM2, byte-level BPE), read from its GGUF file."""
    from quickdraft.models.loading import load_model

    return load_model(None).tokenizer.backend_tokenizer


# --- helpers ------------------------------------------------------------------------------------------


def cut(text: str, stops: list[str]) -> str:
    found = [text.index(stop) for stop in stops if stop in text]
    return text[: min(found)] if found else text


def random_text(rng: random.Random, length: int) -> str:
    if rng.random() < 0.5:
        return "".join(rng.choice(POOL) for _ in range(length))
    return " ".join(rng.choice(SENTENCES) for _ in range(1 + length // 20))


def run(
    decode: Decode, ids: list[int], stops: list[str] | None = None, rng: random.Random | None = None, every: float = 1.0
) -> tuple[TextStream, list[str], int | None]:
    """Push ids until a stop; take deltas after a random share of pushes. Returns the stream, the deltas
    (checked on the way: always a prefix of the final text) and the index of the token that stopped."""
    rng = rng or random.Random(0)
    stream, deltas, stopped_at = TextStream(decode, stops), [], None
    for index, token in enumerate(ids):
        if stream.push(token):
            stopped_at = index
            break
        if rng.random() < every:
            deltas.append(stream.delta())
    final = cut(decode(ids[: len(ids) if stopped_at is None else stopped_at + 1]), stops or [])
    assert final.startswith("".join(deltas)), "a delta was sent that is not part of the final text"
    deltas.append(stream.delta())
    assert final.startswith("".join(deltas))
    assert stream.finish() == final == stream.text
    deltas.append(stream.delta())
    return stream, deltas, stopped_at


def recording(decode: Decode) -> tuple[Decode, list[list[int]]]:
    """decode, plus the list of the ids of each call."""
    calls: list[list[int]] = []

    def recorded(ids: list[int]) -> str:
        calls.append(list(ids))
        return decode(ids)

    return recorded, calls


def counting(decode: Decode) -> tuple[Decode, list[int]]:
    """decode, plus a list of how many ids each call decoded."""
    sizes: list[int] = []

    def counted(ids: list[int]) -> str:
        sizes.append(len(ids))
        return decode(ids)

    return counted, sizes


# --- deltas add up to the text ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["byte_level", "byte_fallback", "smollm2"])
def test_deltas_add_up_to_decode_of_all_ids_for_random_texts(name, request):
    # Real tokenizers on random multilingual text: what is streamed is exactly decode(all ids).
    tokenizer = request.getfixturevalue(name)
    decode, rng = decoder_of(tokenizer), random.Random(1)
    for _ in range(150):
        ids = tokenizer.encode(random_text(rng, rng.randrange(1, 80)), add_special_tokens=False).ids
        _, deltas, _ = run(decode, ids, rng=rng, every=rng.choice([1.0, 0.5, 0.1]))
        assert "".join(deltas) == decode(ids)
        assert all("\ufffd" not in delta for delta in deltas)  # valid text: no character is ever sent half


@pytest.mark.parametrize("name", ["byte_level", "smollm2"])
def test_deltas_add_up_for_random_token_ids_including_invalid_bytes_and_eos(name, request):
    # Byte-level decoding is prefix-stable even for garbage: any id sequence streams exactly.
    tokenizer = request.getfixturevalue(name)
    decode, rng, size = decoder_of(tokenizer), random.Random(2), tokenizer.get_vocab_size()
    for _ in range(150):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 60))]
        _, deltas, _ = run(decode, ids, rng=rng, every=rng.choice([1.0, 0.3]))
        assert "".join(deltas) == decode(ids)


def test_byte_fallback_with_invalid_byte_runs_streams_the_final_texts_length(byte_fallback):
    # Not prefix-stable: a byte run that turns invalid re-decodes its earlier bytes as U+FFFD. Whatever
    # was sent, finish() is decode(all ids) and delta() then gives it past the length already sent.
    decode, rng, size = decoder_of(byte_fallback), random.Random(3), byte_fallback.get_vocab_size()
    for _ in range(150):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 60))]
        stream = TextStream(decode)
        sent = "".join(stream.delta() for token in ids if not stream.push(token))
        final = stream.finish()
        rest = stream.delta()
        assert final == decode(ids)
        assert rest == final[len(sent) :]
        if "\ufffd" not in final:  # no invalid byte run: exact
            assert sent + rest == final


def test_old_cases_deltas_add_up_without_stops():
    stream = TextStream(words)
    sent = "".join(stream.delta() for token in range(len(WORDS)) if not stream.push(token))
    assert sent == words(list(range(len(WORDS))))
    assert stream.finish() == sent and stream.delta() == ""


def test_a_partial_character_waits_for_its_other_bytes():
    stream = TextStream(lambda ids: "ab\ufffd" if len(ids) == 1 else "abc")  # the old test's fake decode
    stream.push(1)
    assert stream.delta() == "ab"
    stream.push(2)
    assert stream.delta() == "c"


def test_multibyte_characters_split_across_tokens_are_never_sent_half():
    # 你 is e4 bd a0, 好 is e5 a5 bd, 🙂 is f0 9f 99 82: here split across tokens in several ways.
    pieces = [b"He", b"llo \xe4", b"\xbd", b"\xa0\xe5\xa5", b"\xbd", b" \xf0\x9f", b"\x99", b"\x82", b"!"]
    decode = fake_bytes(pieces)
    stream = TextStream(decode)
    deltas = []
    for token in range(len(pieces)):
        stream.push(token)
        deltas.append(stream.delta())
    assert deltas == ["He", "llo ", "", "你", "好", " ", "", "🙂", "!"]
    assert stream.finish() == "Hello 你好 🙂!" and stream.delta() == ""


def test_text_before_a_held_character_is_taken_at_once(byte_level):
    # A token that completes one character and begins the next: the complete one is sent now.
    stream = TextStream(fake_bytes([b"a\xe4\xbd", b"\xa0b\xe5", b"\xa5\xbd"]))
    assert not stream.push(0) and stream.delta() == "a"
    assert not stream.push(1) and stream.delta() == "你b"
    assert not stream.push(2) and stream.delta() == "好"
    stream = TextStream(fake_bytes([b"a\xe4\xbd", b"\xa0b\xe5", b"\xa5\xbd"]), ["你b"])
    assert not stream.push(0)
    assert stream.push(1)  # complete although the token's text ends in half a character
    assert stream.text == "a" and stream.delta() == "a"


def test_special_tokens_are_skipped_and_eos_is_pushed_like_any_token(byte_level):
    decode, calls = recording(decoder_of(byte_level))
    eos = byte_level.token_to_id("<eos>")
    ids = byte_level.encode("héllo wörld 你好 🙂").ids
    stream = TextStream(decode, ["STOP"])
    sent = ""
    for token in [*ids[:3], eos, *ids[3:], eos]:  # an EOS in the middle too: it decodes to nothing
        assert not stream.push(token)
        sent += stream.delta()
    assert stream.finish() == "héllo wörld 你好 🙂"
    assert sent + stream.delta() == "héllo wörld 你好 🙂"
    assert calls[-1] == [*ids[:3], eos, *ids[3:], eos]  # the final text is decode(all ids, EOS included)


# --- stop strings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stops", "stops_at", "text"),
    [
        (["STOP"], 6, "Hello world! "),  # spans two tokens
        (["o wo"], 2, "Hell"),  # begins inside one token's text, ends inside the next one's
        (["d! S"], 5, "Hello worl"),  # begins inside one token, spans a whole one, ends inside a third
        (["wor"], 2, "Hello "),  # exactly one token
        (["ll"], 1, "He"),
        (["world", "lo w"], 2, "Hel"),  # the first one complete stops
        (["rld! ", "d!"], 4, "Hello wo"),  # both complete at once: the text ends before the earlier one
        ("P", 6, "Hello world! STO"),  # a single string
        (["nowhere"], None, "Hello world! STOP more"),
    ],
)
def test_stop_strings_are_caught_at_the_token_that_completes_them(stops, stops_at, text):
    stream, deltas, stopped_at = run(words, list(range(len(WORDS))), stops)
    assert stopped_at == stops_at
    assert stream.stopped == (stops_at is not None)
    assert stream.text == stream.finish() == text == "".join(deltas)


def test_old_cases_text_a_stop_string_may_claim_is_held_back_and_never_sent():
    stream = TextStream(words, ["STOP"])
    sent = ""
    for token in range(6):  # up to "STO", which could still become the stop string
        assert not stream.push(token)
        sent += stream.delta()
    assert sent == "Hello world! "
    assert stream.push(6)  # "P" completes it
    assert stream.text == "Hello world! " and stream.stopped
    assert sent + stream.delta() == "Hello world! "
    assert stream.finish() == "Hello world! " and stream.delta() == ""


def test_only_the_end_that_can_begin_a_stop_string_is_held_back():
    stream = TextStream(words, ["STOP", "world!!"])
    stream.push(0), stream.push(1), stream.push(2)
    assert stream.delta() == "Hello "  # "wor" may begin "world!!"
    stream.push(3), stream.push(4)
    assert stream.delta() == "world! "  # "world! " cannot
    stream.push(5)
    assert stream.delta() == ""  # "STO" may begin "STOP"


def test_text_held_before_an_unfinished_stop_string_is_all_sent_by_finish():
    stream = TextStream(words, ["STOP!"])
    sent = ""
    for token in range(7):
        assert not stream.push(token)
        sent += stream.delta()
    assert sent == "Hello world! "  # "STOP" is still held: it may become "STOP!"
    assert stream.finish() == "Hello world! STOP"  # the generation ended (e.g. its length) without one
    assert sent + stream.delta() == "Hello world! STOP"


def test_tokens_pushed_after_a_stop_are_ignored():
    decode, calls = recording(words)
    stream = TextStream(decode, ["lo"])
    assert not stream.push(0) and stream.push(1) and stream.push(2)
    assert stream.finish() == "Hel" and calls[-1] == [0, 1]


@pytest.mark.parametrize("name", ["byte_level", "byte_fallback", "smollm2"])
def test_random_stop_strings_stop_at_the_first_token_whose_text_contains_them(name, request):
    # Stops taken from the text itself, often across tokens and inside multibyte characters.
    tokenizer = request.getfixturevalue(name)
    decode, rng = decoder_of(tokenizer), random.Random(4)
    for _ in range(150):
        ids = tokenizer.encode(random_text(rng, rng.randrange(5, 80)), add_special_tokens=False).ids
        full = decode(ids)
        if len(full) < 3:
            continue
        stops = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            start = rng.randrange(len(full) - 1)
            stops.append(full[start : start + rng.randrange(1, 8)])
        expected = next(j for j in range(len(ids)) if any(s in decode(ids[: j + 1]) for s in stops))
        _, deltas, stopped_at = run(decode, ids, stops, rng=rng, every=rng.choice([1.0, 0.4]))
        assert stopped_at == expected
        assert "".join(deltas) == cut(decode(ids[: expected + 1]), stops)


def test_empty_stop_strings_are_refused():
    with pytest.raises(QuickdraftError, match="stop strings must not be empty"):
        TextStream(words, ["STOP", ""])
    with pytest.raises(QuickdraftError, match="stop strings must not be empty"):
        TextStream(words, "")


# --- not prefix-stable, finish, edge cases ------------------------------------------------------------


def cleanup(pieces: list[str]) -> Decode:
    """Like clean_up_tokenization_spaces: " ." and " ," lose their space (not prefix-stable)."""
    return lambda ids: "".join(pieces[i] for i in ids).replace(" .", ".").replace(" ,", ",")


def test_clean_up_spaces_inside_the_window_stream_exactly():
    # The window starts one step back, so the token before a " ." is decoded with it.
    stream, deltas, _ = run(cleanup(["Hello", " ,", " world", " ."]), [0, 1, 2, 3])
    assert "".join(deltas) == stream.finish() == "Hello, world."


def test_text_that_decoding_changes_after_it_was_sent_cannot_be_unsent():
    # "Hello " is sent before "." arrives and the window starts at " ": the "." is lost while
    # streaming. The final text is right; the client keeps what it got, of the final text's length.
    pieces = ["Hello", " ", ".", " Bye"]
    stream = TextStream(cleanup(pieces))
    sent = "".join(stream.delta() for token in range(4) if not stream.push(token))
    assert sent == "Hello  Bye"
    assert stream.finish() == "Hello. Bye"
    assert stream.delta() == ""


def test_finish_is_idempotent_and_push_after_finish_is_an_error():
    stream = TextStream(words)
    assert stream.finish() == "" and stream.delta() == ""  # nothing generated
    assert stream.finish() == ""
    with pytest.raises(RuntimeError):
        stream.push(0)


def test_a_character_that_never_completes_is_sent_as_replacement_and_the_cost_stays_bounded():
    # Garbage: every token ends in a lead byte that the next one does not continue.
    decode, sizes = counting(fake_bytes([b"\xe4", b"x\xe4"]))
    ids = [0] * 200 + [1] * 200
    stream = TextStream(decode)
    sent = "".join(stream.delta() for token in ids if not stream.push(token))
    assert max(sizes[:-1]) <= 2 * (TextStream.max_pending + 1)  # a window: all but finish()'s decode of everything
    assert stream.finish() == decode(ids) == sent + stream.delta()


def test_a_long_run_of_special_tokens_keeps_the_cost_bounded():
    decode, sizes = counting(fake_bytes([b"a", b"<special>"], special=frozenset({1})))
    stream = TextStream(decode)
    for token in [0] + [1] * 500 + [0]:
        stream.push(token)
    assert max(sizes) <= 2 * (TextStream.max_pending + 1)  # not 500
    assert stream.finish() == "aa" and stream.delta() == "aa"


# --- cost ---------------------------------------------------------------------------------------------


def decode_cost_new(decode: Decode, ids: list[int], stops: list[str]) -> int:
    """Ids decoded to stream `ids` with TextStream: a delta after every token, then finish."""
    counted, sizes = counting(decode)
    stream = TextStream(counted, stops)
    for token in ids:
        stream.push(token)
        stream.delta()
    stream.finish()
    stream.delta()
    return sum(sizes)


def decode_cost_old(decode: Decode, ids: list[int], stops: list[str]) -> int:
    """Ids decoded by the old quickdraft/serve/text.py approach: the whole output at every step
    (its delta() took the growing list of new ids and decoded all of it)."""
    counted, sizes = counting(decode)
    for n in range(1, len(ids) + 1):
        text = counted(ids[:n])
        for stop in stops:
            if stop in text:
                text = text[: text.index(stop)]
    return sum(sizes)


def long_output(tokenizer: Tokenizer, tokens: int) -> list[int]:
    rng = random.Random(5)
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tokenizer.encode(random_text(rng, 60), add_special_tokens=False).ids
    return ids[:tokens]


@pytest.mark.parametrize("name", ["byte_level", "byte_fallback", "smollm2"])
def test_decode_cost_is_linear_in_the_output_length(name, request):
    tokenizer = request.getfixturevalue(name)
    decode = decoder_of(tokenizer)
    for tokens in (500, 4000):
        ids = long_output(tokenizer, tokens)
        cost = decode_cost_new(decode, ids, ["\n\nUser:", "<|im_end|>"])
        # finish() decodes all ids once; per token a window of a few tokens (two decodes when it moves).
        assert cost <= 6 * tokens, (tokens, cost)


def test_the_old_whole_output_approach_fails_the_linear_cost_bound(byte_level):
    tokens = 600
    ids, decode = long_output(byte_level, tokens), decoder_of(byte_level)
    old = decode_cost_old(decode, ids, ["STOP"])
    assert old == tokens * (tokens + 1) // 2 > 6 * tokens  # quadratic: fails the bound the new one meets
    assert decode_cost_new(decode, ids, ["STOP"]) <= 6 * tokens
