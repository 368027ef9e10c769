"""``%gpu_mem`` and ``%%fresh_model``: thin IPython glue over probes, cleanup and rendering."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import keyword
import logging
import shlex
from collections.abc import Callable, Collection, Iterable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from traitlets import Bool, Int, TraitError, observe, validate

from kerasmagic.backends import configure_gpus, reset_peaks
from kerasmagic.cells import run as runner
from kerasmagic.cells.rebinding import rebound_now
from kerasmagic.cleanup import MAX_MB, clean, last_report, pin_mmap_threshold, report_text
from kerasmagic.cleanup.holders import live_models
from kerasmagic.compat import check_now, registry
from kerasmagic.interrupts.held import held_interrupts, plain_interrupts
from kerasmagic.live import CellRecord, get_monitor
from kerasmagic.probes import largest_variables, read_ram
from kerasmagic.snapshot import take_snapshot
from kerasmagic.views import render

ISOLATE_FLAGS = ("inputs", "outputs", "timeout", "gpus", "on")
NO_PEAK = (
    "no allocator peak to reset (no device keeps statistics, or the backend has not started "
    "its devices)"
)

log = logging.getLogger(__name__)


# -- parsing magic lines: every bad line becomes one short UsageError line --------------------
MAX_MESSAGE = 200  # characters of user input echoed back in an error
MAX_LIMIT_MB = 10**7  # 10 TB: beyond any GPU, below TensorFlow's integer limits
# shlex reads a word a character at a time into a growing string: quadratic, 3 s for a 400 KB
# word and hours for 100 MB. No line of options comes near this; a longer one is refused.
MAX_LINE_CHARS = 100_000


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "..."


def parse_line(magic: Any, line: str, cell: bool = False) -> argparse.Namespace | None:
    """Parse ``line`` with ``magic``'s ``@argument`` parser, shell-style (``--gpus ""`` is empty).

    IPython's own ``parse_argstring`` keeps quote characters (``'""'``) and raises a bare
    ``ValueError`` on an unbalanced quote; this raises ``UsageError`` for every bad line.
    A valid line with ``-h``/``--help`` prints the help and returns None: run nothing.
    """
    if len(line) > MAX_LINE_CHARS:
        msg = f"the magic line has {len(line):,} characters; at most {MAX_LINE_CHARS:,} are read"
        raise UsageError(msg)
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read the magic line: {exc}") from None
    try:
        namespace: argparse.Namespace = magic.parser.parse_args(argv)
    except UsageError as exc:
        raise UsageError(_short(str(exc))) from None
    if not getattr(namespace, "help", False):
        return namespace
    # The usage, description and options (what ``%magic?`` shows). IPython's formatter writes
    # reST for docstrings (``::`` then the usage) and one ``%`` whatever the kind of magic; a
    # printed help reads ``usage: %%fresh_model [...]``.
    text, prog = magic.parser.format_help(), magic.parser.prog
    head, _, rest = text.partition(f"%{prog}")
    print(f"usage: {'%%' if cell else '%'}{prog}{rest}" if head.strip(" \n:") == "" else text)
    return None


def megabytes(text: str) -> int:
    """Return a ``--limit`` value: a whole number of megabytes from 1 to 10,000,000."""
    with contextlib.suppress(ValueError):
        if 1 <= (value := int(text)) <= MAX_LIMIT_MB:
            return value
    msg = f"expected whole megabytes, 1 to {MAX_LIMIT_MB}, got {text!r}"
    raise argparse.ArgumentTypeError(_short(msg))


def keep_names(raw: Iterable[str], known: Collection[str], assigned: Collection[str]) -> list[str]:
    """Split ``--keep a,b c`` into names; refuse non-names and names that exist nowhere.

    A name is accepted if the namespace has it (``known``) or the cell assigns it; anything
    else is a typo, refused with the closest namespace name, so no model is dropped by mistake.
    """
    names = [name for item in raw for name in item.split(",") if name]
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise UsageError(_short(f"--keep: {name!r} is not a Python name"))
        if name not in known and name not in assigned:
            close = difflib.get_close_matches(name, [k for k in known if k[:1] != "_"], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else " in the namespace"
            raise UsageError(_short(f"--keep: no variable {name!r}{hint}"))
    return names


def options(table: dict[str, Any]) -> Callable[[Any], Any]:
    """Return ``@magic_arguments`` with an ``@argument`` for each option of ``table`` in its
    order, then ``-h``: an option's value is its help (a switch) or ``argument``'s keywords."""

    def decorate(magic: Any) -> Any:
        for names, spec in reversed([*table.items(), ("-h --help", HELP)]):
            keywords = {"action": "store_true", "help": spec} if isinstance(spec, str) else spec
            magic = argument(*names.split(), **keywords)(magic)
        return magic_arguments()(magic)

    return decorate


HELP = "Show this help; run nothing."
GPU_MEM = {  # %gpu_mem's options, in the help's order
    "--live": "Show a widget that updates after every cell and while cells run "
    "(one line per cell in terminal IPython).",
    "--history": "Show the per-cell memory history.",
    "--plot": "Plot RSS/VRAM per cell (needs matplotlib).",
    "--json": "Print the snapshot as JSON.",
    "--reset-peak": "Reset the backend's per-GPU peak counters.",
    "--deep": "List every live Keras model with its size and what holds it (slow: scans gc).",
    "--growth": "GPU memory on demand, not all at start: TF memory growth, JAX without "
    "pre-allocation (only before the backend starts its GPUs).",
    "--limit": dict(
        type=megabytes,
        metavar="MB",
        help="Cap the Keras backend (TF, JAX, PyTorch) at MB megabytes per GPU (TF and JAX: "
        "only before they start their GPUs).",
    ),
}
FRESH_MODEL = {  # %%fresh_model's options, in the help's order
    "--all": dict(
        action="store_true",
        dest="drop_all",
        help="Drop every model in the namespace (and in its lists/dicts), not only stale ones.",
    ),
    "--keep": dict(nargs="+", default=[], metavar="NAME", help="Never drop these names."),
    "--dry-run": "Only report what would be dropped; clean nothing and do not run the cell.",
    "-q --quiet": "Print no report.",
    "-v --verbose": "Show what the cleanup did in full under the report line (in a notebook it "
    "is one click away: the line's ▸).",
    "--predict": "Before each fit in the cell, predict its peak memory (one line); a fit that "
    "would not fit stops before its first step, naming the batch that fits.",
    "--isolate": "Run the cell in a fresh Python process; all its memory is freed when it ends.",
    "--inputs": dict(nargs="+", metavar="NAME", help="Notebook names sent to --isolate."),
    "--outputs": dict(nargs="+", metavar="NAME", help="Names brought back by --isolate."),
    "--timeout": dict(type=float, metavar="S", help="Kill the isolated process after S s."),
    "--gpus": dict(
        metavar="SPEC",
        help='GPUs of the isolated process: "0", "0,1", "" for CPU; with --on ray: GPUs per run.',
    ),
    "--on": dict(metavar="BACKEND", help="Run the isolated cell on ray or ray://host:port."),
}

CLASHES = (  # %%fresh_model's flags that cannot combine: a flag, what it does, what it refuses
    ("--isolate", "runs the cell in a fresh process: this kernel is not cleaned, its fits not "
     "predicted", ("--all", "--keep", "--dry-run", "--predict", "-v")),
    ("--dry-run", "only says what would be dropped: the cell does not run", ("--predict", "-q")),
    ("-q", "prints no report", ("-v",)),
)  # fmt: skip


DESTS = {"--all": "drop_all", "-q": "quiet", "-v": "verbose"}  # else the long flag's own name


def _dest(flag: str) -> str:
    """The parsed name of one of ``FRESH_MODEL``'s flags."""
    return DESTS.get(flag, flag[2:].replace("-", "_"))


@magics_class
class KerasMagics(Magics):
    """Memory magics for Keras on TensorFlow, JAX or PyTorch (``%load_ext kerasmagic``)."""

    patch_stack_traces = Bool(
        True,
        help="Record TF op stack traces as strings so re-run cells stop growing TF's frame cache.",
    ).tag(config=True)
    mmap_threshold_mb = Int(
        4,
        help="Pin glibc's mmap threshold (MiB) at load, so big freed blocks go back to the OS "
        "instead of growing the heap run after run; 0 leaves glibc's dynamic threshold alone "
        "(a pin cannot be undone: glibc has no call back to its dynamic mode).",
    ).tag(config=True)

    @validate("mmap_threshold_mb")
    def _valid_threshold(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if not 0 <= value <= MAX_MB:
            raise TraitError(f"mmap_threshold_mb must be 0 to {MAX_MB} (MiB), not {value}")
        return value

    @observe("mmap_threshold_mb")
    def _pin_heap(self, change: Any) -> None:
        log.info("kerasmagic: %s", pin_mmap_threshold(change["new"]))

    @property
    def ip(self) -> Any:
        """Return the shell these magics are registered with."""
        assert self.shell is not None, "KerasMagics used without a shell"
        return self.shell

    @options(GPU_MEM)
    @no_var_expand  # a line is options, not code: and expanding an 80 KB line took minutes
    @line_magic
    def gpu_mem(self, line: str) -> None:
        """Show RAM, GPU memory per device, the Keras backend's allocator and caches (TensorFlow,
        JAX, PyTorch; others get one line), graph size and live models."""
        args = parse_line(self.gpu_mem, line)
        if args is None:  # --help: printed
            return
        views = [f"--{v}" for v in ("live", "history", "plot") if getattr(args, v)]
        flags = ("json", "deep", "growth", "reset_peak", "limit")  # a --limit is 1 MB or more
        others = [f"--{o.replace('_', '-')}" for o in flags if getattr(args, o)]
        if views and others:
            msg = f"kerasmagic: {views[0]} shows a view and cannot be combined with {others[0]}: "
            raise UsageError(msg + "run them as two lines")
        if views:
            render.show(self.ip, live=args.live, history=args.history, plot=args.plot)
            return
        if args.growth or args.limit:
            try:
                print(f"kerasmagic: {configure_gpus(args.growth, args.limit)}")
            except (ValueError, ImportError) as exc:
                raise UsageError(str(exc)) from None
        if args.reset_peak:
            done = ", ".join(reset_peaks())
            print(f"kerasmagic: peak reset on {done}" if done else f"kerasmagic: {NO_PEAK}")
        check_now(self.ip)  # a framework imported since: what is off there is listed too
        namespace = self.ip.user_ns
        with plain_interrupts():  # --deep reads every object: a Ctrl-C stops it, shown plain
            snap = take_snapshot(namespace)
            models = live_models(namespace) if args.deep else []
            data_vars = largest_variables(namespace) if args.deep else []
        monitor = get_monitor(self.ip)
        verdict = None if monitor is None else monitor.verdict()
        if args.json:
            data: dict[str, Any] = snap.to_dict()
            data["verdict"] = None if verdict is None else verdict.to_dict()
            if args.deep:
                data["models"] = [dataclasses.asdict(m) for m in models]
                data["variables"] = [dataclasses.asdict(v) for v in data_vars]
            data["off"] = [found.to_dict() for found in registry.off()]
            print(json.dumps(data, indent=1))
            return
        rows = render.snapshot_rows(snap) + render.off_rows(registry.off())
        if verdict is not None and verdict.growing:  # the widget's and sidebar's warning
            rows.append(("Growing", " ".join(verdict.message.split())))
        display(render.Table(f"kerasmagic: memory of kernel pid {snap.pid}", rows))
        if args.deep:
            rows = render.model_rows(models) + render.freed_row(last_report())
            count = sum(m.kind == "model" for m in models)  # not the loose state listed after
            named = snap.keras.live_models
            s, them = ("", "it") if count == 1 else ("s", "them")
            title = f"{count} live Keras model{s}"
            title += "" if named is None else f" ({named} named in the notebook)"
            display(render.Table(f"{title}: what holds {them}, what frees {them}", rows))
            display(render.Table("largest data in the namespace", render.variable_rows(data_vars)))

    @options(FRESH_MODEL)
    @no_var_expand
    @cell_magic
    def fresh_model(self, line: str, cell: str) -> Any:
        """Free stale models and TF state, then run the cell, then report in one line.

        Stale: models under names the cell rebinds (``model = ...``, also in a ``for``/
        ``while``/``with``/``try`` body, not in an ``if``), and models held only by IPython's
        output cache, a stored traceback or a callback's ``.model``. Models under names the
        cell does not touch are kept and listed. Non-model data is never touched.
        """
        __tracebackhide__ = True  # read by IPython's traceback formatter
        args = parse_line(self.fresh_model, line, cell=True)
        if args is None:  # --help: printed, the cell not run
            return runner.no_result(self.ip, cell)
        for flag, does, others in CLASHES:  # a flag another one would silently drop
            clash = next((o for o in others if getattr(args, _dest(o))), None)
            if clash and getattr(args, _dest(flag)):
                raise UsageError(f"{flag} {does}: not with {clash}")
        if args.isolate:
            from kerasmagic.isolate.api import run_cell_isolated

            return run_cell_isolated(self.ip, args, cell)
        if any(getattr(args, name) is not None for name in ISOLATE_FLAGS):
            raise UsageError("--inputs, --outputs, --timeout, --gpus and --on need --isolate")
        if not registry.works("ipython.compiler", self.ip):  # moved: said once, by compat
            self.ip.run_cell(cell)  # %%fresh_model is off: the cell runs as a plain one
            return None
        header = f"%%fresh_model {line}".rstrip()
        start_rss = read_ram().rss_bytes  # the report's start without a record
        # Ctrl-C is held from here to the cell's start: a collection triggered anywhere in this
        # phase runs gc callbacks (JAX registers one), and an interrupt raised inside one is
        # printed as "Exception ignored" and lost.
        with held_interrupts() as held:
            compiled = runner.compile_cell(self.ip, runner.transformed_body(self.ip, cell), header)
            keep = keep_names(args.keep, self.ip.user_ns, compiled.assigned)
            report = clean(
                self.shell,
                self.ip.user_ns,
                rebinding=rebound_now(self.ip.user_ns, compiled.rebinding),
                keep=keep,
                drop_all=args.drop_all,
                dry_run=args.dry_run,
                patch_stack_traces=self.patch_stack_traces,
            )
        held.deliver()
        if args.dry_run:
            display(render.ReportLine(f"kerasmagic: {report.summary()}"))
            return runner.no_result(self.ip, cell)
        after_cleanup = read_ram().rss_bytes

        def report_line() -> None:
            def say(record: CellRecord | None) -> None:
                line = report_text(report, start_rss, after_cleanup, record, read_ram().rss_bytes)
                display(render.ReportLine(f"kerasmagic: {line}", report.summary(), args.verbose))

            monitor = None if args.quiet else get_monitor(self.ip)
            if not args.quiet and (monitor is None or not monitor.at_cell_end(say)):
                say(None)  # no record coming (a magic called inside a cell): said now

        if not args.predict:
            return runner.run(self.ip, compiled, report_line)
        from kerasmagic.oom.batch import fits_predicted

        with fits_predicted():
            return runner.run(self.ip, compiled, report_line)


__all__ = ["KerasMagics"]
