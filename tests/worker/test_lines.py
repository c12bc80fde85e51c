"""A process's output cut into lines as a terminal shows them (`worker.lines`): a progress
bar redrawn with carriage returns is one line of the job's log as it ended, and while it is
redrawn, as it stands at most every 10 s; before, it was one line of every drawing side by
side, said only at its end."""

from __future__ import annotations

import subprocess
import sys

from worker.lines import LineReader, pieces, without_escapes
from worker.processes import output_lines


def reader() -> LineReader:
    return LineReader(max_line=64, every_s=10.0)


def test_lines_end_at_a_newline_and_crlf_is_one_however_the_reads_cut_them() -> None:
    assert pieces(b"a\r\nb\nc\rd") == ([b"a\r\n", b"b\n", b"c\r"], b"d")
    assert pieces(b"a\r") == ([], b"a\r")  # its \n may come next
    lines = reader()
    assert lines.feed(b"one\r", 0.0) == []
    assert lines.feed(b"\ntwo\n\nthree", 0.1) == [b"one", b"two", b""]
    assert lines.close() == [b"three"]


def test_a_progress_bar_is_one_line_as_it_ended() -> None:
    """tqdm writes `\\r` then the bar at each redraw, and a newline at its end; Keras' bar
    the same; some write the bar then `\\r`, or end with `\\r\\n`."""
    tqdm = reader()
    said = [line for t, chunk in enumerate([b"\r  0%|", b"\r 50%|##", b"\r100%|####", b"\n", b"next\n"])
            for line in tqdm.feed(chunk, t * 0.5)]  # fmt: skip
    assert said == [b"100%|####", b"next"]
    trailing = reader()
    assert trailing.feed(b"10%\r20%\r", 0.0) + trailing.feed(b"\r\n", 0.1) == [b"20%"]
    assert reader().feed(b"loading...\rloaded   \n", 0.0) == [b"loaded   "]
    left = reader()  # the process ended mid-bar
    assert left.feed(b"\r 10%\r 20%", 0.0) == [] and left.close() == [b" 20%"]
    assert left.close() == [] and left.tick(100.0) == []


def test_a_long_bar_is_said_as_it_stands_every_ten_seconds_and_once_as_it_ended() -> None:
    bar = reader()
    said = []
    for tenth in range(0, 305):  # 30.5 s of redraws, ten a second
        said += bar.feed(b"\r%3d%%" % (tenth // 3), tenth / 10)
    said += bar.feed(b"\n", 30.5)
    assert said == [b" 33%", b" 66%", b"100%", b"101%"]  # at 10 s, 20 s and 30 s, and as it ended
    quiet = reader()  # a bar that stops moving is said once the interval is over, by the tick alone
    assert quiet.feed(b"\rdownloading 3%", 0.0) == []
    assert quiet.tick(5.0) == [] and quiet.tick(10.0) == [b"downloading 3%"] and quiet.tick(30.0) == []


def test_a_line_past_the_limit_is_cut_and_the_rest_of_it_dropped_redrawn_or_not() -> None:
    lines = reader()
    assert lines.feed(b"x" * 100, 0.0) == [b"x" * 64]
    assert lines.feed(b"y" * 100 + b"\rstill the cut line\nafter\n", 0.1) == [b"still the cut line", b"after"]
    assert lines.feed(b"z" * 80 + b"\n", 0.2) == [b"z" * 64]


def test_output_lines_reads_a_real_process_bar_and_all() -> None:
    code = (
        "import sys, time\n"
        "for i in range(5):\n"
        "    sys.stderr.write(f'\\repoch 0: {i * 25:3d}%'); sys.stderr.flush(); time.sleep(0.05)\n"
        "sys.stderr.write('\\n'); print('done', flush=True)\n"
        "sys.stderr.write('\\rleft at 7%')\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said = [line for line in output_lines(process, 0.05, 2**20, 10.0) if line is not None]
    process.wait()
    assert said == [("err", b"epoch 0: 100%"), ("out", b"done"), ("err", b"left at 7%")], said


def test_a_coloured_line_is_its_text() -> None:
    assert without_escapes("\x1b[32m2026-12-06 | INFO\x1b[0m | saved") == "2026-12-06 | INFO | saved"
    assert without_escapes("\x1b[2K\x1b[1Gepoch 1 \x1b]0;a title\x07done") == "epoch 1 done"
    assert (
        without_escapes("\x1b]8;;https://example.org\x1b\\a link\x1b]8;;\x1b\\ and a lone \x1b") == "a link and a lone "
    )
    assert without_escapes("plain: 100% [====]") == "plain: 100% [====]"
