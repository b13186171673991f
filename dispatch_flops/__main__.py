"""``python -m dispatch_flops`` (installed as ``dispatch-flops``): profile the built-in GPT
demo with no arguments, or any importable model factory, and print the module table."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import textwrap
import time
from typing import Any, Callable, NoReturn, Optional

import torch
from torch import nn

from dispatch_flops import (
    DEVICES,
    DeviceSpec,
    FlopCounter,
    FlopsProfiler,
    Profile,
    __version__,
    measure,
)
from dispatch_flops.counter import ATTENTION_MODES
from dispatch_flops.models import GPT, GPTConfig
from dispatch_flops.results.utilisation import as_spec
from dispatch_flops.views.table import terminal_width

EXAMPLES = """\
examples:
  dispatch-flops
      the built-in GPT demo (4 layers, d_model 256), forward + backward, on the CPU
  dispatch-flops dispatch_flops.models:GPT --input-shape 1,128 --input-dtype int64 --depth 2
  dispatch-flops my_models.py:build --input-shape 8,128 --input-dtype int64 --backward
  dispatch-flops my_models.py:build --input-shape 8,128 --input-dtype int64 --dtype bf16 \\
      --device cuda --backward --timing --repeat 10 --trace trace.json --json run.json
  dispatch-flops my_models.py:llama_70b --input-shape 1,4096 --input-dtype int64 --device meta

MODULE:FACTORY is a module on the Python path (the current directory included), or a .py
file, and a callable in it that takes no arguments and returns a torch.nn.Module (a class
works); my_models.py above is yours, e.g. `def build(): return MyModel()`. It is called under
`with torch.device(DEVICE)`, so --device meta builds even a very large model without
allocating it (shape-only counting). Inputs are random normals (integers in [0, 2) with an
integer --input-dtype), one per --input-shape, seeded. The model runs in eval mode, forward
only, unless --train (train mode) or --backward (train mode, forward + backward); the demo
runs forward + backward in train mode. The table and --deepspeed report the same run.
--trace turns --timing on; open the trace at ui.perfetto.dev or chrome://tracing.
"""

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "half": torch.float16,
           "fp32": torch.float32, "float": torch.float32, "fp64": torch.float64,
           "double": torch.float64, "int64": torch.int64, "long": torch.int64,
           "int32": torch.int32, "int": torch.int32}


def _dtype(text: str) -> torch.dtype:
    name = text.lower().removeprefix("torch.")
    dtype = _DTYPES.get(name, getattr(torch, name, None))
    if not isinstance(dtype, torch.dtype):
        raise argparse.ArgumentTypeError(
            f"unknown dtype {text!r}: use bf16, fp16, fp32, fp64 (or a torch name such as "
            "bfloat16); int64 / int32 for --input-dtype")
    return dtype


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive ints, e.g. 1,3,224,224")
    return shape


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the usage is for ``--help``, not in front of every
    mistake."""

    def error(self, message: str) -> NoReturn:
        if message.startswith(("unrecognized arguments", "the following arguments",
                               "ambiguous option")):
            message += f" ({self.prog} --help lists the options)"
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dispatch-flops",
        description="Count the flops, MACs and bytes of every aten op a model runs, by module "
                    "(and time them with --timing). With no MODULE:FACTORY, profiles the "
                    "built-in GPT demo, forward + backward.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", metavar="MODULE:FACTORY",
                        help="a factory returning the model, e.g. dispatch_flops.models:GPT "
                             "or path/to/file.py:build")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} (torch {torch.__version__})")
    parser.add_argument("--input-shape", type=_shape, action="append", metavar="N,C,...",
                        help="shape of one input (repeat for several inputs)")
    parser.add_argument("--dtype", type=_dtype, metavar="DTYPE",
                        help="the model's (and float inputs') dtype: bf16, fp16, fp32, fp64; "
                             "default: as the factory builds it")
    parser.add_argument("--input-dtype", type=_dtype, metavar="DTYPE",
                        help="the inputs' dtype when it differs (int64 for token ids; "
                             "the default for a model whose first layer is an Embedding)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda, cuda:N, or meta (shapes only, no data)")
    parser.add_argument("--backward", action="store_true",
                        help="also run .sum().backward() on the output (its logits, or its "
                             "first tensor); the model in train mode")
    parser.add_argument("--train", action="store_true",
                        help="the model in train mode (dropout, batch-norm statistics); "
                             "default: eval mode unless --backward")
    parser.add_argument("--attention", choices=ATTENTION_MODES, default="dense",
                        help="is_causal kernels: hardware flops over every (query, key) "
                             "pair, or only the causal ones (model flops: causal either way)")
    parser.add_argument("--timing", action="store_true",
                        help="time every op and module: medians of --repeat runs after "
                             "--warmup untimed ones")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (default 5)")
    _table_options(parser)
    parser.add_argument("--seq-len", type=int,
                        help="the demo's tokens (default 128; demo only: a model's inputs "
                             "are --input-shape)")
    parser.add_argument("--trace", metavar="PATH",
                        help="write a Chrome/Perfetto trace of the first timed run "
                             "(turns --timing on)")
    parser.add_argument("--peaks", metavar="SPEC",
                        help="with --timing, also print MFU and HFU against SPEC: "
                             "'calibrate' (measure this machine's peaks first, ~5 s on a "
                             "CPU) or a built-in device, e.g. H100-SXM (docs/peaks.md)")
    parser.add_argument("--deepspeed", action="store_true",
                        help="also print DeepSpeed's flops-profiler report of the same step, "
                             "in the same mode")
    return parser


# -- checks that need torch -----------------------------------------------------------------
def _available_devices() -> list[str]:
    names = ["cpu", "meta"]
    if torch.cuda.is_available():
        names += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    return names


def _device(parser, text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError as e:
        parser.error(f"--device {text!r}: {e}")
    if device.type in ("cpu", "meta"):
        return device
    backend = getattr(torch, device.type, None)
    if device.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    available = backend is not None and hasattr(backend, "is_available") and \
        backend.is_available()
    if available and device.index is not None and backend is not None and \
            hasattr(backend, "device_count"):
        available = device.index < backend.device_count()
    if not available:
        why = ""
        if device.type == "cuda" and not torch.cuda.is_available():
            why = (f" (this torch, {torch.__version__}, has no CUDA build)"
                   if torch.version.cuda is None else " (no CUDA device found)")
        parser.error(f"--device {text}: not available here{why}; available: "
                     f"{', '.join(_available_devices())}")
    return device


def _factory(parser: argparse.ArgumentParser, spec: str) -> Callable:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        parser.error(f"model {spec!r} is not MODULE:FACTORY (e.g. dispatch_flops.models:GPT "
                     "or my_models.py:build)")
    module_spec = None
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            parser.error(f"cannot import {module_name!r}: no such file")
        sys.path.insert(0, os.path.dirname(path))  # so it can import its neighbours
        name = os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            parser.error(f"cannot import {module_name!r}: not a Python file")
    elif "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script does not add it
    try:
        if module_spec is not None and module_spec.loader is not None:
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except SystemExit as e:  # the module's own: nothing was profiled, say so
        parser.error(f"cannot import {module_name!r}: it called sys.exit({e.code!r})")
    except BaseException as e:
        parser.error(f"cannot import {module_name!r}: {_one_line(e)}")
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            parser.error(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not isinstance(target, nn.Module) and not callable(target):
        parser.error(f"{spec} is a {type(target).__name__}, not a callable returning a model")
    return target


def _fail(message: str) -> NoReturn:
    sys.exit(f"dispatch-flops: error: {message}")


def _one_line(e: BaseException) -> str:
    """``Type: message`` of an exception, on one line: its message's first line (torch's
    errors go on with notes and C++ frames); a ``SystemExit`` as the call it was."""
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__


def _writable(path: str) -> bool:
    """Whether a file can be written at ``path`` (its folder exists and takes files)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return False
    if os.path.exists(path):
        return os.access(path, os.W_OK)
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


def _why_not(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a directory"
    if not os.path.isdir(folder):
        return f"no directory {folder}"
    return "permission denied"


def _deepspeed(model, inputs, step, args, device) -> None:
    """DeepSpeed's printout of the step the table counted, in the same mode; its module
    figures are the forward's, the rest of the step in its summary."""
    timing = device.type != "meta"
    for _ in range(args.warmup if timing else 0):  # as get_model_profile's warm_up
        step(*inputs)
    prof = FlopsProfiler(model, timing=timing)
    prof.start_profile()
    try:
        step(*inputs)
    finally:
        prof.stop_profile()
    prof.print_model_profile(profile_step=1, module_depth=args.depth, detailed=True)
    prof.end_profile()


def _tensor_to_reduce(out) -> Optional[torch.Tensor]:
    """What ``--backward`` differentiates: the output, its ``logits``, or its first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    values = out.values() if isinstance(out, dict) else out if isinstance(
        out, (list, tuple)) else ()
    for value in values:
        found = _tensor_to_reduce(value)
        if found is not None:
            return found
    return None


class _Progress:
    """Warm-up and timed-run counts on stderr: one rewritten line on a terminal, a line per
    step otherwise (logs)."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()

    def __call__(self, stage: str, done: int, total: int) -> None:
        bar = "#" * round(20 * done / total)
        line = f"{stage} {done}/{total} [{bar:<20}]"
        if self.tty:
            end = "\n" if stage == "timed run" and done == total else ""
            self.stream.write(f"\r{line}{end}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# -- main -------------------------------------------------------------------------------------
def main(argv=None) -> None:
    """The command: every error is one line on stderr and a non-zero exit (2: the command
    line; 1: the model, its run or a file; 130: interrupted), never a traceback.
    ``dispatch-flops trace FILE`` prices a recorded trace instead (``_trace``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["trace"]:
            _trace(argv[1:])
        else:
            _main(argv)
    except KeyboardInterrupt:
        print("dispatch-flops: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # `dispatch-flops | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        sys.exit(0)
    except SystemExit:
        raise
    except BaseException as e:  # a case no check below foresaw: still one line
        _fail(_one_line(e))


def _main(argv) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("warmup", "repeat", "depth"):
        minimum = 1 if name == "repeat" else 0
        if getattr(args, name) < minimum:
            parser.error(f"--{name} must be >= {minimum}")
    if args.trace:
        args.timing = True
    device = _device(parser, args.device)
    if args.timing and device.type == "meta":
        parser.error("--timing / --trace need a real device: meta tensors hold no data and "
                     "take no time")
    if args.peaks is not None:
        if not args.timing:
            parser.error("--peaks prints MFU, which needs measured time: add --timing")
        if args.peaks != "calibrate":
            try:  # a key of DEVICES or a device's own name, as every device argument
                args.peaks = as_spec(args.peaks)
            except (TypeError, ValueError):
                parser.error(f"--peaks {args.peaks!r}: 'calibrate' or one of "
                             f"{', '.join(DEVICES)}")
    if args.width is not None and args.width < 40:
        parser.error("--width must be >= 40")
    if args.model is not None and args.seq_len is not None:
        parser.error("--seq-len sets the demo's tokens only; give a model's inputs with "
                     "--input-shape")
    if args.dtype is not None and not (args.dtype.is_floating_point or args.dtype.is_complex):
        parser.error(f"--dtype {str(args.dtype).replace('torch.', '')}: a model's dtype is "
                     "floating point (bf16, fp16, fp32, fp64) or complex; an integer dtype "
                     "is for --input-dtype (token ids)")
    for option in ("json", "csv", "trace"):
        path = getattr(args, option)
        if path is not None and not path.strip():
            parser.error(f"--{option}: the path is empty")
        if path and not _writable(path):
            parser.error(f"--{option} {path}: cannot write there ({_why_not(path)})")
    torch.manual_seed(0)
    if args.model is None:
        model, inputs, label, step = _demo(parser, args, device)
    else:
        model, inputs, label, step = _user_model(parser, args, device)
    training = args.model is None or args.train or args.backward
    model.train(training)
    label += ", train mode" if training else ", eval mode"
    timing = f", timed: median of {args.repeat} runs after {args.warmup} warm-up" \
        if args.timing else ""
    start = time.perf_counter()
    try:
        fc: Profile
        if args.timing:
            fc = measure(model, inputs, fn=step, warmup=args.warmup, repeat=args.repeat,
                         progress=_Progress(), attention=args.attention,
                         trace=bool(args.trace))
        else:
            with FlopCounter(model, attention=args.attention) as counter:
                step(*inputs)
            fc = counter.to_profile()  # measure's result too: one type for the views below
    except (Exception, SystemExit) as e:  # the model's own sys.exit too: nothing counted
        hint = ""
        if inputs and all(t.is_floating_point() for t in inputs) and \
                "indices" in str(e) and ("Long" in str(e) or "Int" in str(e)):
            hint = " (token ids? add --input-dtype int64)"
        _fail(f"running {label} failed: {_one_line(e)}{hint}")
    elapsed = time.perf_counter() - start
    header = f"{label}{timing} ({elapsed:.2f} s in all)"
    print(_fitted_header(header, args.width or terminal_width()) + "\n")
    print(fc.table(depth=args.depth, width=args.width))
    if args.peaks:
        spec = DeviceSpec.calibrate(device) if args.peaks == "calibrate" else args.peaks
        print(f"\n{fc.mfu_text(spec)}\n{fc.hfu_text(spec)}")
    for path, write in ((args.json, fc.to_json), (args.csv, fc.to_csv),
                        (args.trace, fc.to_chrome_trace)):
        if path:
            try:
                write(path)
            except OSError as e:
                _fail(f"cannot write {path}: {e.strerror or e}")
            print(f"wrote {path}", file=sys.stderr)
    if args.deepspeed:
        print()
        _deepspeed(model, inputs, step, args, device)


TRACE_EXAMPLES = """\
examples:
  dispatch-flops trace run.pt.trace.json.gz
  dispatch-flops trace run.json --depth 3 --ops 10 --json priced.json

FILE is a Chrome trace torch.profiler wrote (prof.export_chrome_trace(path), or
tensorboard_trace_handler), JSON or .json.gz, recorded with record_shapes=True (and
with_modules=True for the module tree). Each recorded aten op is priced from its recorded
shapes by the same formulas as a live count; kernel time comes from the trace's own kernels;
the device is the trace's. Ops that cannot be priced are listed with the reason.
"""


def _trace_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dispatch-flops trace",
        description="Price a torch.profiler trace offline: flops, MACs and bytes of every "
                    "recorded op, by module, with its kernels' time, achieved TFLOP/s and "
                    "roofline on the trace's device.",
        epilog=TRACE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="the trace (JSON, plain or .gz)")
    parser.add_argument("--ops", type=int, default=10,
                        help="ops in the roofline table, most time first (default 10; 0: none)")
    _table_options(parser)
    return parser


def _table_options(parser: argparse.ArgumentParser) -> None:
    """The options both commands share: the table's depth and width, the files written."""
    parser.add_argument("--depth", type=int, default=2, help="module tree depth (default 2)")
    parser.add_argument("--width", type=int,
                        help="the table's width in characters (default: the terminal's, 100 "
                             "when output is not a terminal)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON (to_json)")
    parser.add_argument("--csv", metavar="PATH", help="write module x phase x op rows as CSV")


def _trace(argv) -> None:
    from dispatch_flops import device_spec, from_trace
    from dispatch_flops.views.text import roofline_table

    parser = _trace_parser()
    args = parser.parse_args(argv)
    if args.depth < 0:
        parser.error("--depth must be >= 0")
    if args.ops < 0:
        parser.error("--ops must be >= 0")
    if args.width is not None and args.width < 40:
        parser.error("--width must be >= 40")
    for option in ("json", "csv"):
        path = getattr(args, option)
        if path is not None and (not path.strip() or not _writable(path)):
            parser.error(f"--{option} {path!r}: cannot write there"
                         + (f" ({_why_not(path)})" if path.strip() else ""))
    start = time.perf_counter()
    try:
        p = from_trace(args.file)
    except ValueError as e:
        _fail(str(e))
    width = args.width or terminal_width()
    run = p.run
    where = run.device_name or "no device records"
    header = (f"{args.file}: {where}, {sum(1 for _ in p.rows)} rows priced in "
              f"{time.perf_counter() - start:.2f} s")
    print(_fitted_header(header, width) + "\n")
    print(p.table(depth=args.depth, width=width))
    spec = device_spec(run.device_name) if run.device_name else None
    if spec is None and run.device_name:
        print(f"\nNo built-in peaks for {run.device_name!r}: no roofline or MFU "
              "(docs/peaks.md lists the devices)")
    if spec is not None and run.timing:
        roofs = p.roofline_by_operator(spec)
        priced = {name: roofs[name] for name, _ in p.top_ops_by_time(len(roofs))
                  if name in roofs and roofs[name].attainable_s > 0}  # flops or bytes known
        top = dict(list(priced.items())[:args.ops])
        if top:
            print("\n" + roofline_table(top, "Op", spec.name, True, width))
        print(f"\n{p.mfu_text(spec)}\n{p.hfu_text(spec)}")
    for path, write in ((args.json, p.to_json), (args.csv, p.to_csv)):
        if path:
            try:
                write(path)
            except OSError as e:
                _fail(f"cannot write {path}: {e.strerror or e}")
            print(f"wrote {path}", file=sys.stderr)


def _fitted_header(header: str, width: int) -> str:
    """The run's header wrapped to the table's width between its comma-separated parts
    ("forward + backward", "train mode (2.31 s in all)" stay whole); a part longer than a
    line wraps at its spaces."""
    lines: list[str] = []
    width -= 1  # room for the comma a line ends with
    for part in header.split(", "):
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += ", " + part
        elif lines:
            lines[-1] += ","
            lines += textwrap.wrap(part, width, initial_indent="  ", subsequent_indent="  ",
                                   break_on_hyphens=False)
        else:
            lines += textwrap.wrap(part, width, subsequent_indent="  ",
                                   break_on_hyphens=False)
    return "\n".join(lines)


def _input(shape: tuple, dtype: torch.dtype, device: torch.device,
           high: int = 2) -> torch.Tensor:
    """A seeded random input: normals for a floating-point or complex dtype, integers in
    [0, high) otherwise (token ids: the vocabulary size); one error line when torch cannot
    make it (too large, a dtype it cannot draw)."""
    try:
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, dtype=dtype, device=device)
        return torch.randint(0, high, shape, dtype=dtype, device=device)
    except Exception as e:  # RuntimeError (allocation, dtype), OverflowError (sizes), ...
        _fail(f"cannot make an input of shape {','.join(map(str, shape))} and dtype "
              f"{str(dtype).replace('torch.', '')} on {device}: {_one_line(e)}")


def _demo(parser, args, device):
    cfg = GPTConfig()
    if args.seq_len is None:
        args.seq_len = 128
    if not 1 <= args.seq_len <= cfg.max_seq_len:
        parser.error(f"--seq-len must be between 1 and {cfg.max_seq_len}")
    with device:
        model = GPT(cfg)
    if args.dtype is not None:
        model = model.to(args.dtype)
    idx = torch.randint(0, cfg.vocab_size, (1, args.seq_len), device=device)

    def step(idx):
        logits = model(idx)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                          idx.flatten()).backward()
        model.zero_grad(set_to_none=True)  # every run alike: no gradient accumulation

    label = (f"GPT demo: {cfg.n_layer} layers, d_model {cfg.d_model}, batch 1 x "
             f"{args.seq_len} tokens, forward + backward")
    return model, (idx,), label, step


def _token_ids(model: nn.Module) -> Optional[nn.Embedding]:
    """The model's first embedding when its first layer with parameters is one: a token
    model, whose input is integer ids below its vocabulary size."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module
        if next(module.parameters(recurse=False), None) is not None:
            return None
    return None


def _user_model(parser, args, device):
    factory = _factory(parser, args.model)  # a wrong MODULE:FACTORY first: nothing to shape
    if not args.input_shape:
        parser.error(f"{args.model}: give the input's shape, e.g. --input-shape 1,3,224,224 "
                     "(1,128 for 128 token ids)")
    try:
        with device:
            model = factory if isinstance(factory, nn.Module) else factory()
    except SystemExit as e:
        _fail(f"building the model with {args.model}(): {_one_line(e)}")
    except Exception as e:
        _fail(f"building the model with {args.model}() raised {_one_line(e)}")
    if not isinstance(model, nn.Module):
        _fail(f"{args.model}() returned {type(model).__name__}, not a torch.nn.Module")
    try:
        model = model.to(device)
        if args.dtype is not None:
            model = model.to(args.dtype)
    except Exception as e:
        _fail(f"moving the model to {device}{', ' + str(args.dtype) if args.dtype else ''} "
              f"failed: {_one_line(e)}")
    embedding = _token_ids(model) if args.input_dtype is None else None
    input_dtype = args.input_dtype or (torch.int64 if embedding is not None else None) or \
        args.dtype or torch.get_default_dtype()
    inputs = tuple(_input(shape, input_dtype, device, embedding.num_embeddings
                          if embedding is not None else 2) for shape in args.input_shape)

    def step(*inputs):
        if not args.backward:
            with torch.no_grad():
                return model(*inputs)
        out = _tensor_to_reduce(model(*inputs))
        if out is None:
            raise ValueError("--backward found no tensor in the model's output")
        out.sum().backward()
        model.zero_grad(set_to_none=True)  # every run alike: no gradient accumulation

    shapes = " ".join("x".join(map(str, s)) for s in args.input_shape)
    ids = " token ids" if embedding is not None else ""
    label = (f"{args.model}: input {shapes} {str(input_dtype).replace('torch.', '')}{ids} "
             f"on {device}, forward{' + backward' if args.backward else ''}")
    return model, inputs, label, step


if __name__ == "__main__":
    main()
