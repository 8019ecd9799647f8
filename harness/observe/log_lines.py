"""A vLLM log as lines: read from a file, stdin, a run record or a Polyaxon run, then taken apart into the
process that wrote each line, its level, its time stamp and its message."""

from __future__ import annotations

import html
import json
import re
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import pydantic

from harness.errors import HarnessError
from harness.paths import read_bounded_bytes
from harness.polyaxon_client import polyaxon_call
from harness.polyaxon_project import parse_project
from harness.schema import RunFile

MAX_LOG_PAGES = 500
MAX_LOG_BYTES = 2**30  # a start-up log, even one with a long run's requests after it, is far smaller
# What a start that ran can have printed: vLLM refuses a launch with a size below one or a utilisation outside
# (0, 1], so a log stating one is damaged or edited, and is refused naming the figure.
Count = Annotated[int, pydantic.Field(ge=1)]
Fraction = Annotated[float, pydantic.Field(gt=0, le=1, allow_inf_nan=False)]
LOGGED_NUMBER = r"-?\d+(?:\.\d+)?"  # how a log line prints a figure: 0.41, 12, -1.5
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# An issue tracker renders `[worker.py:267]` as a link and a copy of the page keeps it:
# `[[worker.py:267](http://worker.py:267/)]`; the link's text is what vLLM printed.
RENDERED_LINK = re.compile(r"\[([^\[\]\s]+)\]\((?:https?|mailto):[^)\s]*\)")
# `(EngineCore_DP0 pid=12)`, `(Worker_TP1 pid=9)`, `(VllmWorkerProcess pid=3)`, `(RayWorkerWrapper pid=3, ip=…)`
PROCESS_PREFIX = re.compile(
    r"\((?P<process>[A-Za-z][\w\-]*(?: (?:rank=|TP)\d+)?)(?: pid=(?P<pid>\d+))?(?:, ip=[^)]*)?\)\s*"
)
# What a log collector puts before each line vLLM wrote: a quote's `>`, `kubectl logs --prefix`'s
# `[pod/name/container]`, torch.distributed's `[rank0]:` before a rank's output, a container runtime's RFC 3339
# time stamp (`docker logs -t`, `kubectl logs --timestamps`; in a node's containerd log file followed by the
# stream and a full-line tag, `stdout F`), journald's `Aug 01 10:00:00 host unit[pid]:`.
COLLECTOR_PREFIX = re.compile(
    r"^(?:>\s*|\[pod/[^\]\s]+\]\s+|\[rank\d+\]:\s*|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"
    r"(?:(?:stdout|stderr) [FP] )?|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?:\s+)+"
)
# A log shipped as one JSON record a line keeps vLLM's text in one field: Docker's json-file driver and Fluent
# Bit `log`, `journalctl -o json` `MESSAGE`, cloud logging exports `textPayload`, `message` or `msg`.
JSON_RECORD_TEXT = ("log", "MESSAGE", "textPayload", "message", "msg")
LINE_END = re.compile(r"\r\n|\r|\n")
# 0.11+: `INFO 11-29 14:50:31 [core.py:402] msg`; 0.6: `INFO 11-29 14:50:31 core.py:402] msg`; an excerpt whose
# author cut the time stamps: `INFO [core.py:402] msg`.
HEADER_START = (r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?:(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\s+"
                r"\[?|\[)(?P<source>[\w./-]+\.py:\d+)\]")
HEADER = re.compile(HEADER_START + r"\s?(?P<message>.*)$")

# Where a record begins, for a paste that lost its line ends (a page that joined them): the header without its
# message, and a process prefix right before it.
RECORD_START = re.compile(f"(?:{PROCESS_PREFIX.pattern})?{HEADER_START}")


@dataclass(frozen=True)
class LogLine:
    """One physical log line with colour and process prefix removed."""

    process: str | None
    level: str | None
    message: str
    stamp: str | None = None  # "MM-DD HH:MM:SS" from the header, where the line has one
    text: str = ""  # the physical line as logged (colour removed), prefix and header kept
    pid: str | None = None  # the prefix's pid: V0's workers share one process name

    @property
    def speaker(self) -> tuple[str | None, str | None]:
        """The one process that printed the line, where the prefix tells."""
        return self.process, self.pid


def read_log_text(source: str | Path) -> str:
    """Read a log file or `-` (stdin); a binary file or a missing path is one line of bad input."""
    if str(source) == "-":
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        data = read_bounded_bytes(Path(source), MAX_LOG_BYTES, "log")
        name = str(source)
    return decode_log_bytes(data, name)


def decode_log_bytes(data: bytes, name: str) -> str:
    """Logs are UTF-8 text; NUL bytes or undecodable data mean someone passed the wrong file."""
    if b"\x00" in data:
        raise HarnessError(f"{name}: binary file, not a text log (contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HarnessError(f"{name}: not a UTF-8 text log (undecodable byte at offset {error.start})") from None


def read_run_log(run_dir: Path) -> str:
    """The engine log a local run captured beside its record (`engine.log`)."""
    path = Path(run_dir) / RunFile.ENGINE_LOG
    if not Path(run_dir).is_dir():
        raise HarnessError(f"{run_dir}: not a run directory")
    if not path.is_file():
        raise HarnessError(f"{run_dir}: no {RunFile.ENGINE_LOG} in this run directory")
    return read_log_text(path)


def fetch_polyaxon_run_log(run_uuid: str, project: str, client: Any = None) -> str:
    """A Polyaxon run's logs joined into one text, page by page (the API returns up to 2,000 lines a call).

    `client` is a polyaxon `RunClient` for that run; by default one is made from the CLI's configuration.
    """
    named = parse_project(project)
    if client is None:
        from polyaxon.client import RunClient

        client = RunClient(owner=named.owner, project=named.name, run_uuid=run_uuid, manual_exceptions_handling=True)
    lines: list[str] = []
    last_file = last_time = None
    for _ in range(MAX_LOG_PAGES):
        page = polyaxon_call(f"Polyaxon run {run_uuid} in {named}: could not read its logs",
                             partial(client.get_logs, last_file=last_file, last_time=last_time))
        entries = (page.logs if page is not None else None) or []
        if not entries:
            break
        lines.extend(entry.value for entry in entries if entry.value)
        if (page.last_file, page.last_time) == (last_file, last_time):
            break
        last_file, last_time = page.last_file, page.last_time
    return "\n".join(lines)


def unrendered(text: str) -> str:
    """The log as vLLM printed it, from a copy of a page that rendered it: links back to their text,
    HTML entities (`&#39;`, `&gt;`) back to characters, non-breaking spaces back to spaces; a byte-order mark,
    which an editor may save before the first line, dropped."""
    return RENDERED_LINK.sub(r"\1", html.unescape(text)).replace("\xa0", " ").replace("\ufeff", "")


def split_log_lines(text: str) -> list[LogLine]:
    """Strip colour, carriage-return progress bars, page rendering, a collector's and vLLM's process prefixes;
    keep header-less lines otherwise raw."""
    lines: list[LogLine] = []
    for physical in _records(LINE_END.split(unrendered(ANSI_ESCAPE.sub("", text)))):
        stripped = physical.strip()
        if not stripped:
            continue
        unprefixed = COLLECTOR_PREFIX.sub("", stripped)
        header = HEADER.search(unprefixed)
        if header:
            prefix = _process_before(unprefixed[:header.start()])
            lines.append(LogLine(prefix and prefix.group("process"), header.group("level"),
                                 header.group("message").strip(), header.group("stamp"), stripped,
                                 prefix and prefix.group("pid")))
        else:
            prefix = PROCESS_PREFIX.match(unprefixed)
            rest = unprefixed[prefix.end():] if prefix else unprefixed
            lines.append(LogLine(prefix and prefix.group("process"), None, rest, None, stripped,
                                 prefix and prefix.group("pid")))
    return lines


def unwrapped_json_records(text: str) -> str:
    """The log with each JSON record line replaced by the text it carries: what vLLM printed, for the secret
    masking and the line reader alike."""
    return "\n".join(map(_record_text, LINE_END.split(text)))


def _record_text(physical: str) -> str:
    """The text a JSON log record carries, or the line itself where it is not one."""
    stripped = physical.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return physical
    try:
        record = json.loads(stripped)
    except (ValueError, RecursionError):  # not JSON after all, or nested past the parser's depth
        return physical
    texts = [record[key] for key in JSON_RECORD_TEXT if isinstance(record, dict) and isinstance(record.get(key), str)]
    return texts[0].rstrip("\n") if texts else physical


def _records(physical_lines: list[str]) -> list[str]:
    """Each physical line, cut where a further record begins on it: vLLM writes one record a line, so a line
    holding several lost its line ends on the way (an issue page's text joined them)."""
    records = []
    for physical in physical_lines:
        starts = [match.start() for match in RECORD_START.finditer(physical)][1:]
        records += [physical[begin:end] for begin, end in zip([0, *starts], [*starts, None], strict=True)]
    return records


def _process_before(lead: str) -> re.Match[str] | None:
    """The process prefix that ends where the header starts, behind whatever a collector put first (a
    container runtime's time stamp, `kubectl logs --prefix`'s `[pod/…]`, journald's host, a quote's `>`)."""
    matches = [match for match in PROCESS_PREFIX.finditer(lead) if match.end() == len(lead)]
    return matches[-1] if matches else None
