"""What the user types into ``agentik chat``: the line being edited (:class:`LineEditor`, pure)
and the terminal it comes from.

On a terminal the chat reads keys, not lines: the terminal's own echo and line editing are
turned off (:func:`keys_mode`), so that nothing typed while an answer streams lands inside the
answer. The chat echoes what is typed itself when it is waiting for input, and holds it unseen
(still editable) while an answer streams; the screen shows it after the answer
(agentik/client/chat_screen.py). Ctrl-C stays a signal (ISIG is kept on).
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

try:
    import termios
except ImportError:  # not a POSIX system: lines are read as the terminal edits them
    termios = None  # type: ignore[assignment]

#: keys of a terminal in non-canonical mode
ENTER = "\r\n"
ERASE = "\x7f\x08"
KILL_LINE = "\x15"  # Ctrl-U
KILL_WORD = "\x17"  # Ctrl-W
END_OF_INPUT = "\x04"  # Ctrl-D
ESCAPE = "\x1b"


@dataclass(frozen=True)
class Typed:
    text: str


@dataclass(frozen=True)
class Erased:
    count: int


@dataclass(frozen=True)
class Entered:
    line: str


@dataclass(frozen=True)
class EndOfInput:
    pass


Edit = Typed | Erased | Entered | EndOfInput


class LineEditor:
    """The line being typed, and how each key changes it: printable keys append, Backspace
    erases a character, Ctrl-U the line, Ctrl-W a word, Enter ends the line, Ctrl-D on an empty
    line ends the input. Escape sequences (arrow keys, function keys) are skipped."""

    def __init__(self) -> None:
        self.text = ""
        self._escape = ""  # an escape sequence read so far (it may span two reads)

    def feed(self, keys: str) -> list[Edit]:
        edits: list[Edit] = []
        for key in keys:
            if self._escape:
                self._escape = "" if self._escape_ends(key) else self._escape + key
            elif key == ESCAPE:
                self._escape = key
            elif key in ENTER:
                edits.append(Entered(self.text))
                self.text = ""
            elif key in ERASE:
                edits.append(self._erase(1))
            elif key == KILL_LINE:
                edits.append(self._erase(len(self.text)))
            elif key == KILL_WORD:
                kept = self.text.rstrip()
                kept = kept[: len(kept) - len(kept.split()[-1])] if kept.split() else ""
                edits.append(self._erase(len(self.text) - len(kept)))
            elif key == END_OF_INPUT:
                if not self.text:
                    edits.append(EndOfInput())
            elif key == "\t" or key.isprintable():
                self.text += key
                edits.append(Typed(key))
        return [e for e in edits if not (isinstance(e, Erased) and e.count == 0)]

    def _erase(self, count: int) -> Erased:
        count = min(count, len(self.text))
        self.text = self.text[: len(self.text) - count]
        return Erased(count)

    def _escape_ends(self, key: str) -> bool:
        """ESC [ params final, ESC O x, or ESC x: whether ``key`` ends the sequence."""
        if len(self._escape) == 1:
            return key not in "[O"
        if self._escape[1] == "O":
            return True
        return "\x40" <= key <= "\x7e"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal whose keys the chat can read one by one."""
    if termios is None:
        return False
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False


@contextmanager
def keys_mode(stream: TextIO) -> Iterator[None]:
    """The terminal of ``stream`` without its echo and line editing (keys are read one by one;
    Ctrl-C still sends SIGINT); restored on the way out."""
    assert termios is not None
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ICANON | termios.ECHO)
    mode[6][termios.VMIN] = 1
    mode[6][termios.VTIME] = 0
    termios.tcsetattr(fd, termios.TCSANOW, mode)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def read_keys(stream: TextIO, deliver: Callable[[str | None], None]) -> None:
    """(a daemon thread) Read the keys of a terminal, decoded as UTF-8, and hand them over as
    they come; None at the end. A blocking read cannot be cancelled: the thread dies with the
    process."""
    fd = stream.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        try:
            data = os.read(fd, 1024)
        except OSError:
            data = b""
        text = decoder.decode(data, final=not data)
        if text:
            deliver(text)
        if not data:
            deliver(None)
            return


def read_lines(stream: TextIO, deliver: Callable[[str | None], None]) -> None:
    """(a daemon thread) Read the lines of a stream that is not a terminal (a pipe, a file);
    None at the end."""
    while True:
        line = stream.readline()
        deliver(line.rstrip("\n") if line else None)
        if not line:
            return


def start_reader(stream: TextIO, deliver: Callable[[str | None], None], keys: bool) -> None:
    target = read_keys if keys else read_lines
    threading.Thread(target=target, args=(stream, deliver), name="agentik-chat-input",
                     daemon=True).start()
