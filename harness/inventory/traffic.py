"""The user's own traffic as records: OpenAI-format request logs, ShareGPT conversations and CSV of token counts.

Each reader returns every usable record with the line it starts on, and counts the records that are well
formed but carry nothing to replay (a request that generated nothing, a conversation with no answered
question). A ShareGPT conversation is read whole, every exchange in order (`conversations`), or as its first
question and answer alone. A malformed record is refused in one line naming the file, the line and the field: an import
either reads the whole file or writes nothing.

Logs carry many fields besides the ones read here (model, temperature, ids, timestamps): the record models
ignore what they do not read, unlike the project's own models, which forbid any field they do not know.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.errors import HarnessError, describe_validation_error
from harness.inventory.fields import MAX_PROMPT_TOKENS, ChatMessage

# Column names for the input and output token counts of a CSV (lower case): ours, OpenAI's usage fields, and
# those of the public traces (Azure LLM inference: ContextTokens/GeneratedTokens; BurstGPT: Request/Response
# tokens).
INPUT_COLUMNS = ("input_tokens", "prompt_tokens", "contexttokens", "request tokens")
OUTPUT_COLUMNS = ("output_tokens", "completion_tokens", "generatedtokens", "response tokens")
HUMAN_ROLES = ("human", "user")
ASSISTANT_ROLES = ("gpt", "assistant", "chatgpt")
UNANSWERED = "no human turn answered by the assistant"
EMPTY = "an empty question or answer"


class _LogModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Usage(_LogModel):
    prompt_tokens: int | None = Field(None, ge=0, le=MAX_PROMPT_TOKENS)
    completion_tokens: int | None = Field(None, ge=0, le=MAX_PROMPT_TOKENS)


class _Message(_LogModel):
    role: Literal["system", "user", "assistant"]
    content: str


class _OpenAIRecord(_LogModel):
    """One request: a chat request's `messages` or a completion's `prompt`, and what capped or measured its
    output."""

    messages: list[_Message] | None = Field(None, min_length=1)
    prompt: str | None = None
    # bounded as an inventory's output cap is: a larger figure names its line here, not in the frozen model
    max_tokens: int | None = Field(None, ge=1, le=MAX_PROMPT_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_PROMPT_TOKENS)
    usage: _Usage | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> _OpenAIRecord:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a request holds exactly one of messages and prompt")
        return self


class _Turn(_LogModel):
    speaker: str = Field(alias="from")
    value: str


class _Conversation(_LogModel):
    conversations: list[_Turn]


@dataclass(frozen=True)
class Record:
    """What one record replays: a chat request's messages, a completion's text, or only counts."""

    line: int
    messages: list[ChatMessage] | None = None
    text: str | None = None
    prompt_tokens: int | None = None  # a CSV's count, or the log's usage (checked against the tokenizer's)
    output_tokens: int | None = None  # the output cap: usage, max_tokens or a CSV's count
    reply: str | None = None  # ShareGPT: the answer whose token count is the output cap
    exchanges: tuple[Exchange, ...] | None = None  # a whole ShareGPT conversation, one record

    def turns(self) -> list[Record]:
        """A conversation's turns as requests: turn k the exchanges before it as recorded, then its question;
        its answer's length is the output cap. A record of one request is its only turn."""
        if self.exchanges is None:
            return [self]
        history: list[ChatMessage] = []
        turns = []
        for exchange in self.exchanges:
            history = [*history, ChatMessage(role="user", content=exchange.question)]
            turns.append(Record(line=self.line, messages=history, reply=exchange.answer))
            history = [*history, ChatMessage(role="assistant", content=exchange.answer)]
        return turns


@dataclass(frozen=True)
class Exchange:
    """One turn of a recorded conversation: the user's question and the assistant's answer to it."""

    question: str
    answer: str


@dataclass
class Records:
    records: list[Record] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason → records
    later_turns: int = 0  # first exchange only: ShareGPT conversations that went on after it
    cut_conversations: int = 0  # whole conversations: those whose turns stopped alternating before their end

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def read_records(file: Path, text: str, fmt: str, *, conversations: bool) -> Records:
    if fmt == "sharegpt":
        return _read_sharegpt(file, text, conversations)
    readers = {"openai": _read_openai, "csv": _read_csv}
    return readers[fmt](file, text)


def _validated(model: type[BaseModel], value: object, where: str) -> BaseModel:
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, where)) from None


def _json_lines(file: Path, text: str) -> Iterator[tuple[int, object]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deep"
            raise HarnessError(f"{file} line {number}: malformed JSON: {detail}") from None


def _read_openai(file: Path, text: str) -> Records:
    found = Records()
    for number, value in _json_lines(file, text):
        record = _validated(_OpenAIRecord, value, f"{file} line {number}")
        assert isinstance(record, _OpenAIRecord)
        usage = record.usage or _Usage()
        cap = usage.completion_tokens if usage.completion_tokens is not None else (
            record.max_tokens or record.max_completion_tokens)
        if cap is None:
            raise HarnessError(f"{file} line {number}: field 'max_tokens': no max_tokens, max_completion_tokens or "
                               "usage.completion_tokens, so no output cap")
        if cap == 0:
            found.skip("generated nothing (usage.completion_tokens 0)")
            continue
        messages = None if record.messages is None else [
            ChatMessage(role=message.role, content=message.content) for message in record.messages]
        found.records.append(Record(line=number, messages=messages, text=record.prompt,
                                    prompt_tokens=usage.prompt_tokens, output_tokens=cap))
    return found


def _json_values(file: Path, text: str) -> Iterator[tuple[int, object]]:
    """A JSON array's elements with the line each starts on, or JSON lines."""
    stripped = text.lstrip()
    if not stripped.startswith("["):
        yield from _json_lines(file, text)
        return
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        position = _skip_space(text, position)
        if position < len(text) and text[position] == "]":
            return
        line = text.count("\n", 0, position) + 1
        try:
            value, position = decoder.raw_decode(text, position)
        except (json.JSONDecodeError, RecursionError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deep"
            raise HarnessError(f"{file} line {line}: malformed JSON: {detail}") from None
        yield line, value
        position = _skip_space(text, position)
        if position < len(text) and text[position] == ",":
            position += 1
        elif position >= len(text) or text[position] != "]":
            raise HarnessError(f"{file} line {text.count(chr(10), 0, position) + 1}: malformed JSON: expected ',' "
                               "or ']' after a conversation")


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _read_sharegpt(file: Path, text: str, conversations: bool) -> Records:
    """Each conversation from its first human turn on: with `conversations`, the exchanges while human and
    assistant alternate with something to say, as one record; else its first question as a one-message chat
    prompt and the reply as the output cap, later turns counted but not imported."""
    found = Records()
    for number, value in _json_values(file, text):
        conversation = _validated(_Conversation, value, f"{file} line {number}")
        assert isinstance(conversation, _Conversation)
        exchanges, cut = _exchanges(conversation.conversations)
        if not exchanges:
            found.skip(cut or UNANSWERED)
            continue
        if conversations:
            found.cut_conversations += bool(cut)
            found.records.append(Record(line=number, exchanges=tuple(exchanges)))
        else:
            found.later_turns += len(exchanges) > 1 or bool(cut)
            found.records.append(Record(line=number, messages=[ChatMessage(role="user", content=exchanges[0].question)],
                                        reply=exchanges[0].answer))
    return found


def _exchanges(turns: list[_Turn]) -> tuple[list[Exchange], str | None]:
    """The question-and-answer pairs from the first human turn on, and why they stopped short of the end (None:
    they did not). Turns before the first human one (a system prompt, a greeting) are no exchange; a pair is
    complete only with both sides non-empty, and a human turn with no answer after it ends the conversation."""
    first = next((i for i, turn in enumerate(turns) if turn.speaker.lower() in HUMAN_ROLES), len(turns))
    exchanges: list[Exchange] = []
    for position in range(first, len(turns), 2):
        question, answer = turns[position], turns[position + 1] if position + 1 < len(turns) else None
        if question.speaker.lower() not in HUMAN_ROLES or answer is None \
                or answer.speaker.lower() not in ASSISTANT_ROLES:
            return exchanges, UNANSWERED
        if not question.value.strip() or not answer.value.strip():
            return exchanges, EMPTY
        exchanges.append(Exchange(question=question.value, answer=answer.value))
    return exchanges, None if exchanges else UNANSWERED


def _read_csv(file: Path, text: str) -> Records:
    rows = csv.reader(io.StringIO(text))
    header = [cell.strip().lower() for cell in next(rows, [])]
    columns = [next((header.index(name) for name in names if name in header), None)
               for names in (INPUT_COLUMNS, OUTPUT_COLUMNS)]
    if None in columns:
        raise HarnessError(f"{file} line 1: a header naming the input and output token columns is needed "
                           f"(input: {', '.join(INPUT_COLUMNS)}; output: {', '.join(OUTPUT_COLUMNS)})")
    found = Records()
    for number, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        counts = [_count(file, number, header, row, column) for column in columns if column is not None]
        if 0 in counts:
            found.skip("zero input or output tokens")
            continue
        found.records.append(Record(line=number, prompt_tokens=counts[0], output_tokens=counts[1]))
    return found


def _count(file: Path, number: int, header: list[str], row: list[str], column: int) -> int:
    cell = row[column].strip() if column < len(row) else ""
    if not cell.isdigit() or not cell.isascii():
        raise HarnessError(f"{file} line {number}: field '{header[column]}': {cell!r} is not a whole number of "
                           "tokens")
    if int(cell) > MAX_PROMPT_TOKENS:
        raise HarnessError(f"{file} line {number}: field '{header[column]}': {int(cell):,} tokens, more than the "
                           f"{MAX_PROMPT_TOKENS:,} a request may hold")
    return int(cell)
