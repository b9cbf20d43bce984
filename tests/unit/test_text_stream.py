from workers.engines.llama.text_stream import TextStream


def run(pieces: list[bytes], stop: list[str]) -> tuple[str, bool]:
    ts = TextStream(stop)
    out = "".join(ts.feed(p) for p in pieces)
    if not ts.stopped:
        out += ts.flush()
    return out, ts.stopped


def test_no_stop_passes_through() -> None:
    assert run([b"Hel", b"lo"], []) == ("Hello", False)


def test_stop_within_one_piece() -> None:
    assert run([b"Hello END world"], ["END"]) == ("Hello ", True)


def test_stop_split_over_pieces_is_held_then_cut() -> None:
    ts = TextStream(["</s>"])
    assert ts.feed(b"abc<") == "abc"
    assert ts.feed(b"/") == ""
    assert ts.feed(b"s>tail") == ""
    assert ts.stopped


def test_partial_stop_that_does_not_complete_is_released() -> None:
    assert run([b"a<", b"/x"], ["</s>"]) == ("a</x", False)
    assert run([b"a<", b"/"], ["</s>"]) == ("a</", False)  # flushed at the end


def test_earliest_of_several_stops_wins() -> None:
    assert run([b"one two three"], ["three", "two"]) == ("one ", True)
    ts = TextStream(["three", "two"])
    ts.feed(b"one tw")
    assert ts.matched == ""
    ts.feed(b"o three")
    assert ts.matched == "two"  # the stop string that stopped it, as Anthropic's `stop_sequence` reports


def test_utf8_split_across_tokens() -> None:
    data = "héllo 🌊".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]
    assert run(pieces, []) == ("héllo 🌊", False)
