"""omnitts as a Ray Data stage: manifest rows in, audio files in one output directory, metadata rows out.

    import ray, omnitts.ray
    ds = ray.data.read_json("lines.jsonl")                       # any dataset with the manifest's fields
    meta = omnitts.ray.synthesize_dataset(ds, "CKPT", "/shared/out", actors=8, device="cuda", greedy=True)
    meta.write_parquet("/shared/out-meta")                       # id, path, seconds, frames, ... per row

or the stage itself, as `ray.data.llm` wraps vLLM (a callable class the actor pool constructs once):

    ds.map_batches(Synthesizer, fn_constructor_kwargs=dict(model="CKPT", out="/shared/out", device="cuda"),
                   batch_size=64, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=8), num_gpus=1)

Each actor loads one engine (`omnitts.load`) and opens a `Batch` on the output directory, which every actor
shares as one more writer (claims: an item is run by one writer at a time). A call takes a batch of rows
(pyarrow, pandas or a dict of columns), turns each into a manifest `Item` exactly as a manifest line is
(`parse_item`, `LineChecker`; columns named through `columns={field: column}` as `--column`, others
ignored), runs them through one `Pipeline` (continuous batching across the batch's rows), saves each with
`Batch.save` and returns one metadata row per input row (`ROW_SCHEMA`). Audio is written by the actor
straight to the output directory; only these small rows travel through Ray's object store.

Retries are idempotent: before running, a call reads what other writers recorded since its last call; an
id whose last record is good and was made from the row as it is now (the fingerprint) is not run again and
returns its recorded metadata. So a batch Ray retries after its actor died re-runs only the rows the dead
actor had not finished, and no id gets two results; a row the dead actor finished is reported as run by
this run (`skipped` false, `changed` / `damaged` as the dead actor would have said), since it was. A bad
row is an error row (recorded in results.jsonl when it has a usable id), never an exception. Ids must be
unique across the dataset (the CLI checks that in its first pass): a row whose id this run recorded from
another row (another batch of this stage, or another actor's) is an error row that replaces nothing, and
the same row again gets that row's metadata (as a retried batch's does). Every actor is given the run's token
(`run`), which each record carries: a row another command writing the same OUT recorded meanwhile is
`skipped`, not taken for this run's work.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
from pathlib import Path
from typing import Iterator

from .batch.checker import LineChecker
from .batch.manifest import FIELDS, NUMBER, SAFE_ID, Item, _typed_values, parse_item
from .batch.fingerprint import same_print
from .batch.ledger import NAME as LEDGER_NAME, new_run
from .errors import DeviceFailed, OmniTTSError, RequestError, type_label
from .io import user_path
from .params import check_flag

# One metadata row per input row. `skipped`: not run by this run, its metadata is the id's record from before
# it (done or failed by an earlier run) or from another command writing OUT meanwhile; a row that an attempt of
# this run finished before Ray retried its batch is not skipped. This run: its records since `since` in
# results.jsonl (or since the actor started without one), told from other commands' by the `run` token.
# `changed`: run again because the row or the options changed since its record; `damaged`: run again with the
# row and options the same, because its file was damaged or missing (`Batch.rerun` tells the two apart).
COLUMNS = ("id", "path", "seconds", "frames", "finish_reason", "status", "error", "seed", "skipped", "changed",
           "damaged")
BATCH_ROWS = 64  # rows per call by default: several engine batches, so continuous batching stays full


def row_schema():
    """The pyarrow schema of the metadata rows (fixed, so every block of the output dataset agrees)."""
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("path", pa.string()), ("seconds", pa.float64()), ("frames", pa.int64()),
                      ("finish_reason", pa.string()), ("status", pa.string()), ("error", pa.string()),
                      ("seed", pa.int64()), ("skipped", pa.bool_()), ("changed", pa.bool_()),
                      ("damaged", pa.bool_())])


def fields_schema():
    """The pyarrow schema of manifest rows as the CLI hands them to the stage (one column per field)."""
    import pyarrow as pa

    kinds = {str: pa.string(), bool: pa.bool_(), int: pa.int64(), NUMBER: pa.float64()}
    return pa.schema([(name, kinds[kind]) for name, kind in FIELDS.items()])


def item_fields(item: Item) -> dict:
    """A validated manifest item back as its fields (paths absolute, so any actor on a shared filesystem
    resolves them as the manifest did)."""
    r = item.request
    row = {"id": r.id, "text": r.text, "language": r.language, "speaker": r.speaker, "instruct": r.instruct,
           "ref_audio": os.path.abspath(r.ref_audio) if r.ref_audio is not None else None, "ref_text": r.ref_text,
           "x_vector_only": r.x_vector_only, "non_streaming": r.non_streaming, "seed": item.seed,
           "max_seconds": r.max_seconds,
           "voice": os.path.abspath(item.voice_path) if item.voice_path is not None else None, **item.sampling}
    return {name: row.get(name) for name in FIELDS}


def _row(item_id, path=None, seconds=None, frames=None, finish_reason=None, status="ok", error=None, seed=None,
         skipped=False, rerun=None) -> dict:
    """`rerun`: for a row run again over its earlier record, whether for a damaged file (True) or a change
    (False), as `Batch.rerun` says; None for one that had no record."""
    return {"id": item_id, "path": path, "seconds": seconds, "frames": frames, "finish_reason": finish_reason,
            "status": status, "error": error, "seed": seed, "skipped": skipped, "changed": rerun is False,
            "damaged": rerun is True}


class Synthesizer:
    """A Ray Data stage (`map_batches`): one engine per actor, writing into the shared output directory `out`.

    Args:
        model: checkpoint directory (on every node: a shared filesystem, or the same path everywhere).
        out: output directory, shared by every actor (a filesystem every node mounts at this path).
        device, dtype, codec_dtype, max_batch, eager, deterministic, official_tokenizer: as `omnitts.load`.
        greedy, seed, max_frames, format, save_codes, loudness, split_chars, retry_failed, retry_runaway:
            as `omnitts synth`'s flags (`--format` is `format`), checked as it checks them before the model loads
            (TypeError or ValueError naming the option).
        columns: {field: column} as `--column`; other columns of the dataset are ignored.
        base: the folder relative `ref_audio` / `voice` paths resolve against (a manifest's folder);
            `synthesize_dataset` passes the driver's working directory unless told.
        env: environment variables to set in the actor before the model loads (a recipe's [env]); a
            variable already set in the actor wins.
        force: redo every row, done ones included (`--force`), once per run: pass `since` too.
        since: where this run began in OUT/results.jsonl (its size in bytes then): no row recorded after it
            is run again, so a batch Ray retries after its actor died, or another actor, never redoes what
            the run did (with `force` too). `omnitts synth --ray` and `synthesize_dataset` pass it (the log's
            size as they are called); None: when this actor started.
        run: this run's token (any string every actor of the run is given; `synthesize_dataset` makes one):
            each record carries it, which tells what this run's actors recorded after `since` (reported as
            run by this run) from what another command writing the same OUT recorded then (reported as
            `skipped`). None: every record after `since` counts as this run's.

    Batches may be pyarrow tables (what `synthesize_dataset` uses), pandas frames or dicts of columns; the
    result is a pyarrow table of metadata rows (`row_schema`), one per input row, in input order.
    """

    def __init__(self, model, out, *, device: str = "cpu", dtype: str = "auto", codec_dtype: str = "float32",
                 max_batch: int = 8, eager: bool = False, deterministic: bool = False,
                 official_tokenizer: bool = False, greedy: bool = False,
                 seed: int | None = None, max_frames: int | None = None, format: str = "wav",
                 save_codes: bool = False, loudness: float | None = None, split_chars: int | None = None,
                 retry_failed: bool = False, force: bool = False, retry_runaway: int = 0, columns: dict | None = None,
                 base: str | None = None, env: dict | None = None, since: int | None = None, run: str | None = None):
        from .api import load
        from .batch.outdir import Batch
        from .batch.settings import Settings
        from .config import load_config
        from .engine.pipeline import Pipeline

        format = _check_options(**{name: value for name, value in locals().items() if name in CHECKED})
        for key, value in (env or {}).items():
            os.environ.setdefault(key, value)
        model, out = user_path(model), user_path(out)  # `~` is the home folder, as in every path omnitts takes
        self.settings = Settings(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes,
                                 format=format, retry_failed=retry_failed, force=force, retry_runaway=retry_runaway,
                                 loudness=loudness, split_chars=split_chars, official_tokenizer=official_tokenizer)
        self.columns = dict(columns or {})
        self.base = user_path(base or "/")
        taken = set(self.columns.values())  # a column mapped to a field is not read as another field
        self.plan = {name: self.columns.get(name, name) for name in FIELDS if name in self.columns or name not in taken}
        self.cfg = load_config(model)
        self.tts = load(model, device=device, dtype=dtype, codec_dtype=codec_dtype, max_batch=max_batch, eager=eager,
                        official_tokenizer=official_tokenizer, deterministic=deterministic)
        self.checker = LineChecker(self.cfg, split_chars, max_frames, official_tokenizer)
        self.batch = Batch(Path(out), self.settings, self.tts.ckpt.config, self.tts.identity, since=since,
                           sample_rate=self.tts.sample_rate, run=run)
        self.pipeline = Pipeline(self.tts, retry_runaway=retry_runaway, split=self.settings.splitter(),
                                 sink=self.batch.sink, started=self.batch.started)
        self.earlier: set[str] = set()  # the file names of the ids of this stage's earlier calls (`_name`)

    def __call__(self, batch):
        rows = _pylist(batch)
        items, out = [], [None] * len(rows)  # out: the metadata row of each input row, filled below
        # file name -> (the row that took it, its id): an id belongs to its first row, even a bad one; where
        # OUT's filesystem folds case, ids alike but for case are one file name (`Batch.fold_case`)
        seen: dict[str, tuple[int, str]] = {}
        for index, raw in enumerate(rows):
            obj = {name: raw[column] for name, column in self.plan.items() if _present(raw.get(column))}
            try:
                item = parse_item(_typed_values(obj), index + 1, self.base, self.columns)
                taken = seen.get(self._name(item.request.id))
                if taken is not None and taken[1] == item.request.id:
                    raise RequestError(f"id: {item.request.id!r} already used by another row of this batch")
                if taken is not None:
                    raise RequestError(f"id: {item.request.id!r} names the same file as another row's {taken[1]!r} "
                                       f"on this case-insensitive filesystem ({self.batch.fold_case})")
                self.checker.check(item)
            except RequestError as exc:
                out[index] = self._bad(_raw_id(obj.get("id")), str(exc), seen, index)
                continue
            seen[self._name(item.request.id)] = (index, item.request.id)
            items.append(item)
        self.batch.ledger.refresh()  # what other writers (actors, an earlier attempt of this batch) recorded
        ran: dict[str, bool | None] = {}  # id -> its `Batch.rerun` entry (None: none), for the items this call runs
        twice: set[str] = set()  # ids this run recorded from another row (`_other_row`): not run
        try:
            for outcome in self.pipeline.run(self._pending(items, ran, twice)):
                rec = self.batch.save(outcome)
                out[seen[self._name(rec["id"])][0]] = _row(rec["id"], rec["path"], rec["seconds"], rec["frames"],
                                            rec["finish_reason"], rec["status"], rec["error"], rec["seed"],
                                            rerun=ran[rec["id"]])
        except DeviceFailed:  # its running items count a death each (batch/claims.py); the run fails with it
            self.batch.writer.abandon_running()
            raise
        for item_id in twice:  # not recorded: the record is the other row's
            out[seen[self._name(item_id)][0]] = _row(None, status="error", finish_reason="error", error=(
                f"id: {item_id!r} already used by another row of this run (in another batch); ids must be unique "
                "across the dataset"))
        if len(ran) + len(twice) < len(items):  # the rest were done (or failed) before: their recorded metadata
            self.batch.ledger.refresh()
            for item in items:
                if item.request.id not in ran and item.request.id not in twice:
                    out[seen[self._name(item.request.id)][0]] = self._recorded(item.request.id)
        self.earlier.update(seen)
        return _table(out)

    def _name(self, item_id: str) -> str:
        """What makes two ids one file name in OUT: the id, or its lower case where OUT's filesystem folds case."""
        return item_id.lower() if self.batch.fold_case else item_id

    def _recorded(self, item_id: str) -> dict:
        """The metadata row of an item this call did not run: its last record's. A record another writer
        made during this run (an attempt of this batch whose actor died) makes it a row run by this run,
        run again over an earlier run's record as `Ledger.replaced` says (as `Batch.rerun` would have)."""
        ledger = self.batch.ledger
        this_run = ledger.ours(item_id) or self._name(item_id) in self.earlier
        rerun = ledger.replaced.get(item_id) if this_run and not self.settings.force else None
        done = ledger.done.get(item_id)
        if done is not None:
            return _row(item_id, done.path, done.seconds, done.frames, done.finish_reason, seed=done.seed,
                        skipped=not this_run, rerun=rerun)
        if item_id in ledger.failed:
            return _row(item_id, status="error", finish_reason="error", error=ledger.failed[item_id],
                        skipped=not this_run, rerun=rerun)
        # pending() skips only recorded ids; kept as an honest error row rather than a crash
        return _row(item_id, status="error", error="no record found for a skipped item", skipped=True)

    def _bad(self, item_id, message: str, seen: dict, index: int) -> dict:
        """A row that is not a valid item: an error row, recorded under its id when that is usable (a safe id
        no earlier row of the batch took; a later row with it is then a duplicate, as in a manifest)."""
        usable = isinstance(item_id, str) and SAFE_ID.match(item_id) and self._name(item_id) not in seen
        if not usable:
            return _row(None, status="error", finish_reason="error", error=message)
        seen[self._name(item_id)] = (index, item_id)
        message = f"{item_id}: {message}"
        self.batch.record_bad(item_id, message)
        return _row(item_id, status="error", finish_reason="error", error=message)

    def _pending(self, items: list, ran: dict, twice: set) -> Iterator:
        """`Batch.pending`'s jobs (or None: wait), noting which ids run and why each one recorded before runs
        again (`Batch.rerun`: its file damaged, or its row or the options changed); a job for another row than
        the one this run recorded under its id is given back unrun, its id noted in `twice`."""
        pending = self.batch.pending(items)
        while True:
            job = next(pending, _END)
            if job is _END:
                return
            if job is not None and self._other_row(job):
                self.batch.give_back(job)
                twice.add(job.request.id)
                continue
            if job is not None:
                ran[job.request.id] = self.batch.rerun.get(job.request.id)  # read now: `save` pops it
            yield job

    def _other_row(self, job) -> bool:
        """Whether `job`, handed out by `Batch.pending` (just after reading the log), is for another row than the
        one this run recorded under its id (another actor of the run, or an earlier call of this stage): an id
        used twice in the dataset, in two batches, whose audio would replace the other row's. The same row
        again (a batch Ray retried after its actor died) is not: it is skipped, or runs for a damaged file."""
        item_id, ledger = job.request.id, self.batch.ledger
        if not ledger.ours(item_id) and self._name(item_id) not in self.earlier:
            return False
        done = ledger.done.get(item_id)
        recorded = done.fingerprint if done is not None else ledger.failed_prints.get(item_id)
        return not same_print(recorded, self.batch._fingerprint(job), old=False)

    def close(self) -> None:
        batch = getattr(self, "batch", None)  # None: __init__ failed before the directory was opened
        if batch is not None:
            batch.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the kernel drops locks anyway
            pass


_END = object()
CHECKED = ("greedy", "seed", "max_frames", "format", "save_codes", "loudness", "split_chars", "retry_failed", "force",
           "retry_runaway", "columns", "since", "env", "run")  # the stage's options that `_check_options` checks


def _check_options(*, format, loudness, split_chars, retry_runaway, columns, since, env, run, **flags) -> str:
    """The stage's options checked as `omnitts synth` checks its flags, before the model loads (in an actor a bad
    one failed every batch, or was taken: greedy="no" decoded greedily, a loudness of +5 LUFS was aimed at):
    TypeError or ValueError naming the option. Returns the format as files are named (`FLAC` is `flac`)."""
    from .io.audio import FORMATS
    from .params import SamplingParams

    SamplingParams(max_frames=flags.pop("max_frames"), seed=flags.pop("seed"))  # their types and ranges
    for name, value in flags.items():
        check_flag(name, value)
    kind = format.strip().lower().removeprefix(".") if isinstance(format, str) else None
    if kind not in FORMATS:
        raise ValueError(f"format: {format!r}; choose one of {', '.join(FORMATS)}")
    if loudness is not None and (isinstance(loudness, bool) or not isinstance(loudness, numbers.Real)
                                 or not -70.0 <= loudness <= 0.0):
        raise ValueError(f"loudness: {loudness!r}; choose a level from -70 to 0 LUFS (e.g. -23 or -16), or None")
    for name, value in (("split_chars", split_chars), ("retry_runaway", retry_runaway), ("since", since)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0):
            raise ValueError(f"{name}: {value!r}; expected an integer >= 0")
    if columns is not None and not (isinstance(columns, dict) and all(
            name in FIELDS and isinstance(column, str) and column for name, column in columns.items())):
        raise ValueError(f"columns: {columns!r}; expected {{field: column name}}, the fields among {', '.join(FIELDS)}")
    if env is not None and not (isinstance(env, dict) and all(isinstance(key, str) and isinstance(value, str)
                                                              for key, value in env.items())):
        raise ValueError(f"env: {env!r}; expected {{variable: value}}, both strings")
    if run is not None and not (isinstance(run, str) and run.strip()):
        raise ValueError(f"run: {run!r}; expected a token (a non-empty string every actor of the run shares), or None")
    return kind


def _present(value) -> bool:
    """A cell that holds a value (tables mark absent values with nulls, pandas with NaN)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _raw_id(value):
    """The id a bad row names, as a good row's is read (`_typed_values`): an integer or a whole float (a pandas
    integer column with gaps, 7.0) as its digits, so the bad row takes the id "7" as the good row would."""
    return _typed_values({"id": value})["id"]


def _pylist(batch) -> list[dict]:
    """A batch in any of Ray's formats -> a list of row dicts."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch.to_pylist()
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return pa.Table.from_pandas(batch, preserve_index=False).to_pylist()
    columns = {name: list(values.tolist() if hasattr(values, "tolist") else values) for name, values in batch.items()}
    count = len(next(iter(columns.values()), []))
    return [{name: values[i] for name, values in columns.items()} for i in range(count)]


def _table(rows: list[dict]):
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=row_schema())


def synthesize_dataset(ds, model, out, *, actors: int = 1, batch_size: int = BATCH_ROWS, num_gpus: float | None = None,
                       resources: dict | None = None, num_cpus: float | None = None, **kwargs):
    """The metadata dataset of synthesizing every row of Ray dataset `ds` into `out` with `actors` engines.

    Lazy, as Ray datasets are: iterate it, `write_parquet` it or `materialize()` it to run. Each actor asks
    for `num_gpus` (default: 1 on cuda), `resources` (default: {"NPU": 1} on npu) or `num_cpus` (default:
    1 on cpu). `kwargs` go to `Synthesizer` (model options, decoding, output, `columns`); `since` defaults
    to where OUT/results.jsonl ends now, so that every actor takes what the others record as this run's (a
    `force` redoes each row once, a row whose id another row of the run took is refused).
    """
    import ray.data

    if isinstance(actors, bool) or not isinstance(actors, numbers.Integral) or actors < 1:
        raise OmniTTSError(f"actors: {actors!r}; at least 1")
    actors = int(actors)  # numpy's too, as load's max_batch (np.int64(2) was refused as "at least 1")
    # Checked here as each actor checks them, so a bad one fails once, before any actor starts (an unknown
    # keyword: TypeError)
    options = inspect.signature(Synthesizer).bind(model, out, **kwargs)
    options.apply_defaults()
    _check_options(**{name: options.arguments[name] for name in CHECKED})
    if not callable(getattr(ds, "map_batches", None)):  # a list of rows or a DataFrame, as TTS.stream takes
        raise TypeError(f"ds: expected a Ray Dataset (ray.data.read_json(path), ray.data.from_items(rows), "
                        f"ray.data.from_pandas(df)), got {type_label(type(ds))}")
    device = kwargs.get("device", "cpu")
    ask = {}
    if num_gpus is not None or (device == "cuda" and resources is None and num_cpus is None):
        ask["num_gpus"] = 1 if num_gpus is None else num_gpus
    if resources is not None or (device == "npu" and not ask):
        ask["resources"] = resources if resources is not None else {"NPU": 1}
    if num_cpus is not None or not ask:
        ask["num_cpus"] = 1 if num_cpus is None else num_cpus
    kwargs.setdefault("base", os.getcwd())
    # the actors' working directory is not ours; `~` is the driver's home folder
    model, out = os.path.abspath(user_path(model)), os.path.abspath(user_path(out))
    if kwargs.get("since") is None:  # the run begins now for every actor (each would take its own start for it)
        log = Path(out) / LEDGER_NAME
        kwargs["since"] = log.stat().st_size if log.is_file() else 0
    if kwargs.get("run") is None:  # one token for every actor: what they record is this run's, not another command's
        kwargs["run"] = new_run()
    return ds.map_batches(Synthesizer, fn_constructor_kwargs=dict(model=model, out=out, **kwargs),
                          batch_size=batch_size, batch_format="pyarrow",
                          compute=ray.data.ActorPoolStrategy(size=actors), **ask)


def dataset_from_items(items, chunk_rows: int = BATCH_ROWS):
    """A Ray dataset of validated manifest items, built `chunk_rows` at a time: each chunk becomes one Arrow
    block put in Ray's object store at once (spilled to disk beyond its memory), so the driver holds one
    chunk, never the manifest. A block is the unit Ray hands an actor, so `chunk_rows` is best the stage's
    batch size: every actor then draws work from one shared queue of small blocks."""
    import pyarrow as pa
    import ray
    import ray.data

    schema, refs, chunk = fields_schema(), [], []
    for item in items:
        chunk.append(item_fields(item))
        if len(chunk) == chunk_rows:
            refs.append(ray.put(pa.Table.from_pylist(chunk, schema=schema)))
            chunk = []
    if chunk or not refs:
        refs.append(ray.put(pa.Table.from_pylist(chunk, schema=schema)))
    return ray.data.from_arrow_refs(refs)
