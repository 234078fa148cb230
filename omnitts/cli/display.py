"""What a run shows on the terminal: the loading line, the progress bar (items, elapsed, ETA, audio seconds and
speed), and the closing lines: the stopped-early line, the summary table and its notes, --verbose's capture
costs. The commands own the terminal (the library reports through records and counts); this module only
formats what `Batch.tally` and the pipeline's stats say."""

from __future__ import annotations

from .options import plural


def loading_line(load_kwargs: dict) -> str:
    """"loading checkpoint: cpu, bfloat16 (auto), codec float32, max batch 8": what the run is about to
    use, with `--dtype auto` resolved (bfloat16 on a CPU with native bf16, float32 on another)."""
    from ..device.features import resolve_dtype

    device, asked = load_kwargs["device"], load_kwargs["dtype"]
    dtype = resolve_dtype(asked, device) + (" (auto)" if asked == "auto" else "")
    return f"loading checkpoint: {device}, {dtype}, codec {load_kwargs['codec_dtype']}, max batch {load_kwargs['max_batch']}"


def progress_bar(console, quiet: bool):
    """The progress bar of a run (items, elapsed, ETA, audio seconds and speed); not started yet."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class Eta(TimeRemainingColumn):
        """The time left, or none once a stop was asked for: the run will not run the items it counts."""

        stopped = False

        def render(self, task):
            return Text("-:--:--", style="progress.remaining") if self.stopped else super().render(task)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), Eta(), TextColumn("{task.fields[rate]}"))
    return quiet_bar(Progress(*columns, console=console, disable=quiet), quiet)


def stop_eta(progress) -> None:
    """Turn `progress`'s ETA off (a stop was asked for): at 2 of 30 items it said 0:00:01 while 28 were dropped."""
    for column in progress.columns:
        if hasattr(column, "stopped"):
            column.stopped = True


def quiet_bar(progress, quiet: bool):
    """`progress`, which with `quiet` is never started or stopped: rich 13.0 ends even a disabled bar
    with a blank line when the console is not a terminal (newer releases do not)."""
    if quiet:
        progress.start = progress.stop = lambda: None
    return progress


def advance(progress, tally) -> None:
    """Show `tally` on a run's progress bar (its one task): items accounted for, audio written, speed."""
    progress.update(progress.task_ids[0], completed=tally.done + tally.failed + tally.skipped + tally.others,
                    rate=f"{tally.seconds:.1f} s audio, {tally.realtime:.2f}x realtime")


def graph_line(stats: dict) -> str:
    """The --verbose lines: what capturing frame graphs (and the prefill's and codec's call graphs) cost this run
    (`Pipeline.graph_stats`)."""
    engines = plural(stats["engines"], "engine")
    calls = "".join(f"\n{what} graph capture: {plural(stats[f'{what}_captures'], 'graph')} in "
                    f"{stats[f'{what}_capture_seconds']:.2f} s" for what in ("prefill", "codec")
                    if stats.get(f"{what}_captures"))
    if not stats["captures"]:
        return f"graph capture: none (frames ran eagerly; {engines} built){calls}"
    return (f"graph capture: {plural(stats['captures'], 'graph')} in {stats['capture_seconds']:.2f} s, "
            f"{plural(stats['warmup_frames'], 'eager warm-up frame')} ({engines} built){calls}")


def stopped_early(console, batch, total: int) -> None:
    """The line a stopped run closes with: how many of its `total` items it left, and how to go on."""
    t = batch.tally
    left = max(0, total - t.done - t.failed - t.skipped - t.others)
    console.print(f"stopped early, {plural(left, 'item')} not run yet: run the same command again to resume "
                  f"({batch.out}/results.jsonl keeps what is done)")


def summary(console, batch) -> None:
    """The closing table, the failures, and why items were skipped (with the flag that runs them)."""
    from rich.table import Table

    t = batch.tally
    table = Table(title=f"omnitts synth -> {batch.out}", show_header=True)
    for name in ("done", "failed", "skipped", "audio", "wall time", "speed"):
        table.add_column(name, justify="right")
    table.add_row(str(t.done), str(t.failed), str(t.skipped), hms(t.seconds), hms(t.wall),
                  f"{t.realtime:.2f}x realtime" if t.done else "-")
    console.print(table)
    for item_id, message in t.errors:
        console.print(f"  failed {item_id}: {message}")
    if t.failed > len(t.errors):
        console.print(f"  ... and {t.failed - len(t.errors)} more (see {batch.out}/results.jsonl)")
    if t.others:
        console.print(f"{plural(t.others, 'item')} recorded by other writers of {batch.out} during this run "
                      "(not run here)")
    done_before = t.skipped - t.earlier_failed
    if done_before:
        console.print(f"{plural(done_before, 'item')} already done in {batch.out}: skipped (--force redoes "
                      f"{'it' if done_before == 1 else 'them'})")
    if t.changed:
        its, changed = "its" if t.changed == 1 else "their", t.changed - t.damaged
        why = (f"{its} line or the options changed since the earlier run" if not t.damaged
               else f"{its} file damaged or missing" if not changed
               else f"{changed} with the line or the options changed since the earlier run, {t.damaged} with the "
                    "file damaged or missing")
        console.print(f"{plural(t.changed, 'item')} run again: {why} (each file replaced)")
    if t.earlier_failed:
        one = t.earlier_failed == 1
        console.print(f"{plural(t.earlier_failed, 'item')} failed in an earlier run and still "
                      f"{'has' if one else 'have'} no audio: --retry-failed runs {'it' if one else 'them'} again "
                      f"(errors in {batch.out}/results.jsonl)")


def hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Checking:
    """A transient line on a terminal's stderr while synth's first pass reads a long manifest, before the model
    loads ("checking lines.jsonl: 120,000 lines"), so a million lines are not a minute of silence. It appears once
    `every` lines are read (a short manifest shows nothing), counts on per `every`, and is gone when the pass ends.
    Nothing without a terminal or with `quiet`. Use as a context manager; call `tick()` per line."""

    def __init__(self, manifest, quiet: bool, every: int = 10_000, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.shown = not quiet and self.console.is_terminal
        self.manifest, self.every, self.count, self.status = manifest, every, 0, None

    def tick(self) -> None:
        self.count += 1
        if self.shown and self.count % self.every == 0:
            text = f"checking {self.manifest}: {self.count:,} lines"
            if self.status is None:
                self.status = self.console.status(text)
                self.status.start()
            else:
                self.status.update(text)

    def __enter__(self) -> "Checking":
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
