"""What `omnitts synth` does once its manifest has been read: run the pending items (in this process, in one
worker process per device, or on Ray) behind a progress bar, stopping cleanly on a signal, then print the closing
summary (display.py: what the terminal shows; stopping.py: the signals), and turn filesystem errors into one line
and an exit code."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from ..errors import DeviceFailed, OmniTTSError
from ..stops import exit_code
from .display import advance, graph_line, loading_line, progress_bar, quiet_bar, stopped_early, summary
from .options import fail, plural, warning_line, warnings_as_lines
from .stopping import ForwardingStop, GracefulStop


def run_synth(batch, manifest, model, cfg, columns, split_chars, good, bad, engine, official_tokenizer,
               export_dataset, quiet, workers_on=None, ray=None, verbose=False, read_as=None):
    """synth after pass 1: run the pending items (here, in one worker process per device of `workers_on`, or
    on Ray with `ray` = (address, actors, recipe)), export, exit code. `read_as`: the manifest's state
    (`sources.state`) before pass 1; another at the end means lines were added or edited during the run."""
    from ..batch.manifest import BadLine, iter_manifest
    from ..batch.sources import state

    out = batch.out

    def items():  # pass 2 (and the export): the good items, read again lazily
        return (entry for entry in iter_manifest(manifest, cfg, columns, split_chars, batch.fold_case,
                                                    batch.settings.max_frames, official_tokenizer)
                if not isinstance(entry, BadLine))

    load_kwargs = dict(engine, official_tokenizer=official_tokenizer)
    shown: set[str] = set()  # warnings said already (workers' too)
    try:
        with warnings_as_lines(shown):  # a reference clip over 30 s: one `warning:` line per clip
            workers_on, ray = _engines_to_start(batch, items, workers_on, ray, quiet)
            if ray is not None:
                stopped = _run_ray(batch, items, good + bad, model, load_kwargs, quiet, *ray)
            elif workers_on is None:
                stopped = _run(batch, items(), good + bad, model, load_kwargs, quiet, verbose)
            else:
                from ..workers import Plan, cpu_threads

                plan = Plan(manifest, model, columns, out, batch.settings, load_kwargs, cpu_threads(workers_on),
                            batch.shard, since=batch.ledger.offset, run=batch.run, fold_case=batch.fold_case)
                stopped = _run_workers(batch, workers_on, plan, good, bad, quiet, verbose, shown)
                batch.ledger.refresh()  # what every worker wrote: for the export and the check below
    except DeviceFailed as exc:
        done = done_count(batch)
        fail(f"{exc}: {plural(done, 'item')} done ({out}/results.jsonl), the items it was running not recorded; run "
             "the same command again to resume once the device works", code=1)
    except OmniTTSError as exc:
        fail(str(exc))
    except OSError as exc:
        os_error(exc, out, batch)
    except KeyboardInterrupt as exc:
        if (out / "results.jsonl").exists():
            typer.echo(f"interrupted: finished items are recorded in {out}/results.jsonl; run the same command "
                       "again to resume", err=True)
        else:
            typer.echo("interrupted before any item was recorded; run the same command again to start", err=True)
        raise typer.Exit(exit_code(exc))
    if export_dataset is not None and not batch.tally.done + batch.tally.skipped + batch.tally.others:
        typer.echo(f"--export-dataset {export_dataset}: nothing exported, no item of the manifest has audio in {out}",
                   err=True)
    elif export_dataset is not None:
        from ..batch.export import export_dataset as export

        current = (item for item in items() if batch.mine(item.request.id) and batch.is_current(item))
        try:
            count = export(out, current, export_dataset)
        except (OSError, OmniTTSError) as exc:
            _export_failed(exc, export_dataset, out, batch)
        typer.echo(f"exported {plural(count, 'item')} to {export_dataset}", err=True)
    if stopped:
        raise typer.Exit(stopped)
    if read_as is not None and state(manifest) != read_as:
        typer.echo(f"error: {manifest} changed while the run read it: its lines as they are now were not all checked "
                   "(a bad line added or edited since the run began is neither reported nor recorded); run the same "
                   "command again to check and finish them", err=True)
        raise typer.Exit(1)
    if workers_on is not None:
        _check_all_have_audio(batch, items(), bad)
    if batch.tally.failed or batch.tally.earlier_failed:  # some items of the manifest have no audio
        raise typer.Exit(1)


def _engines_to_start(batch, items, workers_on, ray, quiet: bool):
    """(workers_on, ray) cut to what the items left to run need: with none left (a re-run of a finished
    manifest), neither, so that the one-process loop skips them all without loading a model anywhere;
    with fewer than --workers / --devices asked for, one worker each (the first devices)."""
    if workers_on is None and ray is None:
        return workers_on, ray
    to_run = batch.count_to_run(items(), len(workers_on) if workers_on is not None else 1)  # (Ray: whether any)
    if not to_run:
        return None, None
    if workers_on is not None and to_run < len(workers_on):
        if not quiet:
            typer.echo(f"{plural(to_run, 'item')} to run: starting {to_run} of the {len(workers_on)} workers", err=True)
        workers_on = workers_on[:to_run]
    return workers_on, ray


def _check_all_have_audio(batch, items, bad: int) -> None:
    """After the workers: exit 1 if some good item has no current audio, saying so where no failure explains
    it (the worker that held it died and none finished it)."""
    t = batch.tally
    missing = sum(1 for item in items if batch.mine(item.request.id) and not batch.is_current(item))
    unexplained = missing - (t.failed - bad) - t.earlier_failed
    if unexplained > 0:
        typer.echo(f"error: {plural(unexplained, 'item')} still {'has' if unexplained == 1 else 'have'} no audio "
                   f"(a worker died and no other finished {'it' if unexplained == 1 else 'them'}): run the same "
                   "command again to finish", err=True)
    if missing:
        raise typer.Exit(1)


def _run_ray(batch, items, total: int, model: Path, load_kwargs: dict, quiet: bool, address: str | None,
             workers: int | None, recipe: Path | None):
    """`_run` on Ray: the manifest's good items as a Ray dataset through `omnitts.ray.Synthesizer` actors.

    Joins the cluster at `address` (a local one when None). Progress counts the metadata rows as they
    stream back; the closing summary and exit code are the normal path's, with results.jsonl (which the
    actors write) the truth for which items have audio. Returns 130/143 if a signal stopped it, else None.
    """
    import signal
    import time
    import warnings

    import ray
    import ray.data
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..batch.claims import clear_stopped
    from ..batch.ledger import Ledger
    from ..ray import BATCH_ROWS, dataset_from_items, synthesize_dataset

    console = Console(stderr=True)
    s, tally = batch.settings, batch.tally
    mine = lambda: (item for item in items() if batch.mine(item.request.id))  # noqa: E731 (this --shard's)
    for name in ("ray", "ray.data"):  # Ray Data logs each execution at INFO on its own handler
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="ray")  # e.g. "the operator only received 1 input(s)"
    init = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    if address is None:
        init["include_dashboard"] = False
    # ray.init takes SIGTERM over (its driver's handler exits with code 15, after a stack dump from its core
    # worker): a scheduler's SIGTERM is ours, a stop that exits 143 as every run's does
    previous, started = signal.getsignal(signal.SIGTERM), time.time()
    try:
        ray.init(address=address, **init)
    except ConnectionError as exc:  # an OSError, but no file of OUT's: no cluster at the address
        fail(f"--ray-address {address}: cannot join the Ray cluster ({str(exc).strip() or type(exc).__name__}); "
             "nothing was run", code=1)
    signal.signal(signal.SIGTERM, previous)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        if workers is None:
            resource = {"cuda": "GPU", "npu": "NPU"}.get(load_kwargs["device"])
            workers = max(1, int(ray.cluster_resources().get(resource, 0))) if resource else 1
        env = {}
        if recipe is not None:
            from ..recipe import load_recipe

            env = dict(load_recipe(recipe).env)
        options = dict(load_kwargs, greedy=s.greedy, seed=s.seed, max_frames=s.max_frames, format=s.format,
                       save_codes=s.save_codes, loudness=s.loudness, split_chars=s.split_chars,
                       retry_failed=s.retry_failed, force=s.force, retry_runaway=s.retry_runaway,
                       env=env)
        if not quiet:
            console.print(f"ray: {plural(workers, 'actor')} on {load_kwargs['device']} "
                          f"({ray.cluster_resources().get('CPU', 0):g} CPUs in the cluster)")
        rows = max(1, min(BATCH_ROWS, -(-(total - tally.failed) // workers)))  # every actor gets blocks to work on
        options["since"] = batch.ledger.offset  # a batch Ray retries finds what this run already did
        options["run"] = batch.run  # the actors' records are this run's; another command's, made meanwhile, are not
        meta = synthesize_dataset(dataset_from_items(mine(), chunk_rows=rows), model, batch.out, actors=workers,
                                  batch_size=rows, **options)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[rate]}"))
        with quiet_bar(Progress(*columns, console=console, disable=quiet), quiet) as progress:
            progress.add_task("synthesizing", total=total, completed=tally.failed, rate="")
            for rows in meta.iter_batches(batch_size=None, batch_format="pyarrow"):
                batch.ledger.refresh()  # the records of these rows (and whose they are), written before the rows came
                for row in rows.to_pylist():
                    _count_row(row, batch.ledger, tally, console)
                advance(progress, tally)
    except KeyboardInterrupt:
        ray.shutdown()  # takes the actors down mid-item: the stop's doing, not their items' (no death counted)
        clear_stopped(batch.out, started)
        raise
    except Exception as exc:  # an actor that cannot start (checkpoint, device), a full disk in an actor, ...
        message = str(exc).strip().splitlines()
        fail(f"the Ray run failed: {message[-1] if message else type(exc).__name__} (what is done is kept in "
              f"{batch.out}/results.jsonl; run the same command again to resume)", code=1)
    finally:
        ray.shutdown()
    batch.ledger = Ledger(batch.out)  # results.jsonl as the actors left it: the truth for the exit code and export
    failed = batch.ledger.failed  # items whose last record is a failure are reported as such by the summary
    missing = sum(1 for item in mine() if not batch.is_current(item) and item.request.id not in failed)
    summary(console, batch)
    if missing > 0:
        console.print(f"{plural(missing, 'item')} of the manifest still {'has' if missing == 1 else 'have'} no "
                      f"audio in {batch.out}: run the same command again")
        return 1
    return None


def _count_row(row: dict, ledger, tally, console) -> None:
    """One metadata row of the Ray stage into the closing summary's tally. `ledger`: the driver's, read past the
    row's record: a row skipped for a record that another command (not this run's actors) made during the
    run is that writer's (`others`), one skipped for an earlier run's record is `skipped`."""
    if row["skipped"] and row["id"] in ledger.theirs:
        tally.others += 1
    elif row["skipped"] and row["status"] == "ok" and row["id"] in ledger.done:
        tally.skipped += 1
    elif row["skipped"] and row["status"] != "ok" and row["id"] in ledger.failed:
        tally.skipped += 1
        tally.earlier_failed += 1
    else:  # run now (or by an attempt of this run that Ray retried)
        if row["status"] == "ok":
            tally.done += 1
            tally.seconds += row["seconds"] or 0.0
        else:
            tally.fail(row["id"], row["error"])
            console.print(f"error: {row['id']}: {row['error']}")
        if row["changed"] or row["damaged"]:  # run again over its record: counted as `Batch.save` counts it
            tally.rerun(bool(row["damaged"]))


def done_count(batch) -> int:
    """Items whose last record is good, less those this run was running again (their file damaged or missing,
    or their line changed): what a message saying "N items done" may count without opening every file."""
    return sum(1 for item_id in batch.ledger.done if item_id not in batch.rerun)


def os_error(exc: OSError, out: Path, batch) -> None:
    """A filesystem error (a full disk, EACCES, EIO, a filesystem turned read-only...) ends the run with
    one line naming the file and the error, exit 1. What is done stays done (nothing is half-written:
    see batch/outdir.py), so the same command resumes once the cause is fixed."""
    from ..io.atomic import cannot_write, disk_full

    done = done_count(batch) if batch is not None else 0
    resume = f"{plural(done, 'item')} done ({out}/results.jsonl); "
    if disk_full(exc):
        fail(f"no space left on {out}: {resume}free some space and run the same command again to resume", code=1)
    fail(f"{cannot_write(exc, out)}: {resume}fix that and run the same command again to resume", code=1)


def _export_failed(exc: Exception, target: Path, out: Path, batch) -> None:
    """An export that failed (a full disk...) left nothing behind (batch/export.py); the synthesized items stay
    done, so the same command exports them without synthesizing again. One line, exit 1."""
    from ..io.atomic import disk_full, os_reason

    if disk_full(exc):
        reason = "no space left on device"
    elif isinstance(exc, OSError):
        reason = (f"cannot write {exc.filename}: " if exc.filename else "") + os_reason(exc)
    else:
        reason = str(exc)
    done = done_count(batch)
    fail(f"--export-dataset {target}: {reason}; nothing was exported, the {plural(done, 'item')} done in {out} "
          "stay done: fix that and run the same command again to export", code=1)


def _run(batch, items, total: int, model: Path, load_kwargs: dict, quiet: bool, verbose: bool = False) -> int | None:
    """Synthesize the pending `items` into `batch`, with a progress bar, Ctrl-C handling and a summary
    (`verbose`: with what graph capture cost).

    Returns the exit code of a signal that stopped the run early (130 Ctrl-C, 143 SIGTERM), else None.
    The loop itself is batch/run.py's (the workers of --workers run the same one).
    """
    from contextlib import ExitStack

    from rich.console import Console

    from ..api import load
    from ..batch.run import run_items

    console = Console(stderr=True)
    tally = batch.tally
    progress = progress_bar(console, quiet)
    stopping = GracefulStop(console, progress)

    with ExitStack() as stack:
        def loaded():  # only when some item is pending: then the bar and the signal handlers start
            if not quiet:
                console.print(loading_line(load_kwargs), soft_wrap=True)
            tts = load(model, **load_kwargs)
            stack.enter_context(stopping)
            stack.enter_context(progress)
            progress.add_task("synthesizing", total=total, rate="")
            return tts

        def report(rec: dict) -> None:
            if rec["status"] != "ok":
                console.print(f"error: {rec['id']}: {rec['error']}")
            advance(progress, tally)

        stats = {}
        run_items(batch, items, loaded, stopping.requested, report, stats)
    stopped = stopping.exit_code if stopping.count else None
    if stopped:
        stopped_early(console, batch, total)
    summary(console, batch)
    if verbose and stats:
        console.print(graph_line(stats))
    return stopped


def _run_workers(batch, devices: list[str], plan, good: int, bad: int, quiet: bool,
                 verbose: bool = False, shown: set[str] | None = None) -> int | None:
    """Run one worker process per device on `batch`'s directory: one progress bar, one summary (`verbose`:
    with what graph capture cost, all workers together). `shown`: warnings said already (the workers'
    come here as events, each said once whichever worker raised it).

    The workers report their records here; a worker that dies is named (the others take over its
    items). Returns the exit code of a signal that stopped the run early, as `_run` does.
    """
    from contextlib import ExitStack

    from rich.console import Console

    from ..pool import MAX_RESTARTS, Pool
    from ..workers import name

    console = Console(stderr=True)
    tally = batch.tally
    pool = Pool(plan, devices, tally, batch.ledger)
    progress = progress_bar(console, quiet)
    stopping = ForwardingStop(console, pool, progress)
    with ExitStack() as stack:
        stack.enter_context(stopping)
        stack.callback(pool.shutdown)  # after a second Ctrl-C: the workers get a moment to end, then are killed
        pool.start()
        if not quiet:
            console.print(f"started {plural(len(devices), 'worker')}: {', '.join(devices)}")
        for event in pool.events():
            kind, index = event[0], getattr(event[1], "index", event[1])
            who = name(index, devices[index])
            if kind == "loading" and not progress.task_ids:
                if not quiet:
                    console.print(loading_line(plan.load_kwargs), soft_wrap=True)
                stack.enter_context(progress)
                progress.add_task("synthesizing", total=good + bad, rate="")
            elif kind == "record" and event[3] != "ok":
                console.print(f"error: {event[2]}: {event[4]}")
            elif kind == "error" and event[3] != "disk":  # a full disk: said once, by the closing line
                console.print(f"error: {who}: {event[2]}")
            elif kind == "warning":
                warning_line(event[2], set() if shown is None else shown)
            elif kind == "ended" and not event[1].stopped:
                ended = event[1]
                if ended.restarted:
                    rest = f"started again ({ended.restarted} of {MAX_RESTARTS}); the items it was running will run alone"
                elif pool.alive():
                    rest = "the others take over its items"
                else:
                    rest = "its items are left for the next run"
                how = "stopped" if ended.broke else f"died: {ended.reason}"
                if pool.errors.get(index, ("", ""))[1] == "disk":  # not a death: the closing line says what to do
                    how, rest = "stopped", f"no space left on {batch.out}"
                console.print(f"{who} {how}; {rest}")
            if progress.task_ids:
                advance(progress, tally)
    stopped = stopping.exit_code if stopping.count else None
    if stopped:
        stopped_early(console, batch, good + bad)
    elif pool.all_finished():
        # Each worker counts its siblings' items as "others"; a writer outside this command recorded
        # what no worker ran and no earlier run finished.
        tally.others = max(0, good - tally.skipped - tally.done - (tally.failed - bad))
    summary(console, batch)
    if verbose and pool.graphs:
        console.print(graph_line(pool.graphs))
    kinds = {kind for _, kind in pool.errors.values()}
    if "disk" in kinds:
        fail(f"no space left on {batch.out}: {plural(tally.done, 'item')} done in this run "
              f"({batch.out}/results.jsonl); free some space and run the same command again to resume", code=1)
    writes = [message for message, kind in pool.errors.values() if kind == "write"]
    if writes:  # EACCES, EROFS, EIO...: one line naming the file, as one process says it
        fail(f"{writes[0]}: {plural(tally.done, 'item')} done in this run ({batch.out}/results.jsonl); fix that and "
              "run the same command again to resume", code=1)
    if kinds == {"usage"} and len(pool.errors) == len(devices) and not tally.done:
        raise typer.Exit(2)  # every worker refused to start (each said why): nothing could run
    return stopped


