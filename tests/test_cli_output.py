"""The CLI's plain printer (forkd.cli.output): tables line up by visible width, style tags become colours on a
terminal only, and a bracket that is not one of the styles is printed as it is (a guest's text is never read as
markup). No VM, no daemon."""

from __future__ import annotations

import io

from forkd.cli.output import _Printer, table


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_columns_line_up_by_visible_width_and_justify():
    text = table([("ID", "left"), ("STATUS", "left"), ("PID", "right")],
                 [["c1", "[green]running[/]", "12"], ["c2222", "dead", "1234567"]])
    assert text.split("\n") == ["[bold]ID[/]     [bold]STATUS[/]       [bold]PID[/]",
                                "c1     [green]running[/]       12",
                                "c2222  dead     1234567"]


def test_a_cell_of_several_lines_takes_several_rows():
    text = table([("CHECK", "left"), ("DETAIL", "left")], [["qemu", "missing\n[dim]fix: apt install[/]"]])
    assert text.split("\n")[1:] == ["qemu   missing", "       [dim]fix: apt install[/]"]


def test_styles_are_dropped_on_a_pipe_and_coloured_on_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    pipe, tty = io.StringIO(), Tty()
    for f in (pipe, tty):
        monkeypatch.setattr("sys.stdout", f)
        _Printer(stderr=False).print("[red]error:[/] a[0] [b] [/x]")
    assert pipe.getvalue() == "error: a[0] [b] [/x]\n"
    assert tty.getvalue() == "\x1b[31merror:\x1b[0m a[0] [b] [/x]\n"
    monkeypatch.setenv("NO_COLOR", "1")
    tty = Tty()
    monkeypatch.setattr("sys.stdout", tty)
    _Printer(stderr=False).print("[bold]x[/]")
    assert tty.getvalue() == "x\n"
