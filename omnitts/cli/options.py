"""The command line's vocabulary: help panels, every option's declaration (shared by the commands), the engine
defaults, and the one-line error exit."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from ..stops import exit_code

# Help panels: every option of every command sits in one of these (details in the README).
INPUT, DECODING, ENGINE, OUTPUT = "Input", "Decoding", "Engine", "Output"
FLAG = ""  # metavar of on/off flags: no "<bool>" placeholder (a flag takes no value)


class PlainHelp:
    """--help itself shows no "<bool>" placeholder either."""

    def get_help_option(self, ctx):
        shown = super().get_help_option(ctx)
        if shown is not None:
            shown.metavar = FLAG
        return shown


class Command(PlainHelp, TyperCommand):
    """A command stopped by Ctrl-C or SIGTERM where it does not handle the stop itself (while torch imports,
    or the manifest's first pass) says so and exits with the shell's code, 130 or 143: typer would exit 130
    in silence whichever signal it was."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            typer.echo("interrupted", err=True)
            raise typer.Exit(exit_code(exc)) from None


class Group(PlainHelp, TyperGroup):
    pass


def option(*names: str, panel: str, metavar: str = FLAG, show_default: bool = False, **kwargs):
    """A typer.Option in help panel `panel`; defaults show only when asked (the help says the others)."""
    return typer.Option(*names, metavar=metavar, rich_help_panel=panel, show_default=show_default, **kwargs)


def user_path(value: Path | None) -> Path | None:
    """A path option's callback: `~` is the home folder, also where the shell left it (`--out=~/x`, quoted), as
    the library takes paths (`omnitts.io.user_path`)."""
    from ..io import user_path as expand

    return None if value is None else expand(value)


def path(value: str) -> Path:
    """The parser of every path argument and option (with callback=user_path): an empty one is refused, as
    Path("") is ".", so `-o "$OUT"` with OUT unset would write into the current folder. (Named `path`: help
    shows a parser's name as the type.)"""
    from ..io import url_problem

    if not value:
        raise typer.BadParameter("an empty path (an unset shell variable?); give one, or '.' for the current folder")
    if problem := url_problem(value):
        raise typer.BadParameter(problem)
    return Path(value)


Model = Annotated[Path, option("--model", "-m", callback=user_path, parser=path, panel=INPUT, metavar="DIR",
                                help="Checkpoint directory (Qwen3-TTS-12Hz-*).")]
Out = Annotated[Path, option("--out", "-o", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                              help="Output directory: OUT/ID.wav, OUT/results.jsonl.")]
Greedy = Annotated[bool, option("--greedy/--no-greedy", panel=DECODING, help="Argmax decoding instead of sampling.")]
MaxFrames = Annotated[Optional[int], option("--max-frames", panel=DECODING, metavar="N", min=1,
                                             help="Frame budget per item (12.5 frames/s).")]
def _seed(value: int | None) -> int | None:
    """--seed is a 64-bit integer, as a line's seed (checked here: click's range would print its bounds in the help)."""
    if value is None:
        return None  # (params imports torch: not while parsing a command line that gives no seed)
    from ..params import seed_problem

    if problem := seed_problem(value):
        raise typer.BadParameter(problem)
    return value


Seed = Annotated[Optional[int], option("--seed", panel=DECODING, metavar="N", callback=_seed,
                                        help="Seed for items without their own (64-bit).")]
# voice-clone's, for the one text it speaks
TextMaxFrames = Annotated[Optional[int], option("--max-frames", panel=DECODING, metavar="N", min=1,
                                                help="Frame budget of --text (12.5 frames/s).")]
TextSeed = Annotated[Optional[int], option("--seed", panel=DECODING, metavar="N", callback=_seed,
                                           help="Seed of --text (64-bit; the line printed gives the one drawn).")]
def _folded(value: str | None) -> str | None:
    """A name option's callback: `--device CUDA`, `--dtype BFloat16` mean their lower-case names, as `--format WAV`
    means wav (the names are all lower case; a recipe's values are folded alike, by `Recipe`)."""
    return None if value is None else value.strip().lower()


Dtype = Annotated[Optional[str], option("--dtype", panel=ENGINE, metavar="TYPE", callback=_folded,
                                         help="auto, float32, bfloat16 or float16. [default: auto]")]
CodecDtype = Annotated[Optional[str], option("--codec-dtype", panel=ENGINE, metavar="TYPE", callback=_folded,
                                              help="float32, or bfloat16 (faster, lossier). [default: float32]")]
Device = Annotated[Optional[str], option("--device", panel=ENGINE, metavar="NAME", callback=_folded,
                                          help="cpu, cuda, npu. [default: cpu]")]
MaxBatch = Annotated[Optional[int], option("--max-batch", panel=ENGINE, metavar="N", min=1,
                                            help="Requests decoded together. [default: 8]")]
Eager = Annotated[Optional[bool], option("--eager/--no-eager", panel=ENGINE,
                                          help="No graph capture on cuda/npu. [default: no-eager]")]
Deterministic = Annotated[bool, option("--deterministic", panel=ENGINE,
                                         help="Bitwise audio in any batch.")]
Workers = Annotated[Optional[int], option("--workers", panel=ENGINE, metavar="N",
                                          help="Engine processes, one per device (cpu: up to one per core); with --ray: actors.")]
Devices = Annotated[Optional[str], option("--devices", panel=ENGINE, metavar="LIST", callback=_folded,
                                           help="One worker per device: cuda:0,cuda:1 / npu:0-7 / cpu,cpu.")]
RecipeOpt = Annotated[Optional[Path], option("--recipe", "-r", callback=user_path, parser=path, panel=ENGINE, metavar="FILE",
                                              help="TOML settings; flags win.")]

ENGINE_DEFAULTS = dict(device="cpu", dtype="auto", codec_dtype="float32", max_batch=8, eager=False,
                       deterministic=False)
SaveCodes = Annotated[bool, option("--save-codes", panel=OUTPUT, help="Also write ID.codes.npy (int64, frames x 16).")]
OfficialTok = Annotated[bool, option("--official-tokenizer", panel=DECODING,
                                      help="Tokenize as the official qwen-tts package does.")]
Quiet = Annotated[bool, option("--quiet", "-q", panel=OUTPUT, help="No progress bar; errors and summary still print.")]
Verbose = Annotated[bool, option("--verbose", "-v", panel=OUTPUT,
                                  help="Also report graph capture costs.")]
Strict = Annotated[bool, option("--strict", panel=INPUT, help="Synthesize nothing if any manifest line is bad.")]
RetryFailed = Annotated[bool, option("--retry-failed", panel=OUTPUT,
                                      help="Run again the items an earlier run failed.")]
Force = Annotated[bool, option("--force", panel=OUTPUT, help="Redo every item, finished ones included.")]
Format = Annotated[str, option("--format", panel=OUTPUT, metavar="EXT", show_default=True,
                                help="Audio format: wav, flac or ogg.")]
ColumnMap = Annotated[Optional[list[str]], option("--column", panel=INPUT, metavar="F=COL",
                                                   help="Read field F from column COL; repeatable.")]
IdCol = Annotated[Optional[str], option("--id-column", panel=INPUT, metavar="COL",
                                         help="Column holding the id (--column id=COL).")]
TextCol = Annotated[Optional[str], option("--text-column", panel=INPUT, metavar="COL",
                                           help="Column holding the text (--column text=COL).")]
ManifestArg = Annotated[Path, typer.Argument(metavar="MANIFEST", show_default=False, callback=user_path, parser=path,
                                             help="JSONL, CSV/TSV, Parquet, Arrow or a datasets folder.")]
Loudness = Annotated[Optional[float], option("--loudness", panel=OUTPUT, metavar="LUFS",
                                              help="Normalize each output's loudness (e.g. -23).")]
ShardOpt = Annotated[Optional[str], option("--shard", panel=INPUT, metavar="K/N",
                                           help="Take only shard K of N (by id), e.g. one per Slurm task.")]
SplitChars = Annotated[Optional[int], option("--split-chars", panel=INPUT, metavar="N", min=0,
                                              help="Split longer texts at sentences (0: never).")]
MAX_RUNAWAY_RETRIES = 10  # each retry costs a whole budget; more is a typo more often than a plan


def _runaway_retries(value: int) -> int:
    if not 0 <= value <= MAX_RUNAWAY_RETRIES:  # checked here, not by min/max: a range widens the help's column
        raise typer.BadParameter(f"{value}: choose 0 to {MAX_RUNAWAY_RETRIES}")
    return value


RetryRunaway = Annotated[int, option("--retry-runaway", panel=DECODING, metavar="N", callback=_runaway_retries,
                                      show_default=True, help="Retries for items that hit the frame budget.")]
UseRay = Annotated[bool, option("--ray", panel=ENGINE, help="Run on a Ray cluster: one engine per actor.")]
RayAddress = Annotated[Optional[str], option("--ray-address", panel=ENGINE, metavar="ADDR",
                                              help="Ray cluster to join (auto, ray://...). [default: local]")]
ExportDataset = Annotated[Optional[Path], option("--export-dataset", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                                                  help="Also save the results as a datasets dataset.")]


def fail(message: str, code: int = 2):
    """The command's one error line on stderr, then exit `code` (2: a usage error, before anything ran)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def warning_line(message: str, shown: set[str]) -> None:
    """`warning: MESSAGE` on stderr, once per message (`shown`: those said already)."""
    if message not in shown:
        shown.add(message)
        typer.echo(f"warning: {message}", err=True)


@contextmanager
def warnings_as_lines(shown: set[str] | None = None):
    """Python warnings raised inside (a reference clip over 30 s) as `warning: MESSAGE` lines, the CLI's style
    (no source line), each message once; `shown` carries that across several blocks."""
    shown = set() if shown is None else shown
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *args, **kwargs: warning_line(str(message), shown)
        yield


def either(choices) -> str:
    """("a", "b", "c") -> "a, b or c"."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

