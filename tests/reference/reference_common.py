"""Code shared by the PyTorch reference drivers of `satdar grad`.

baseline_reference.py and designs_reference.py both write a case's config,
weights and tokens, run `satdar grad` (or a fake built on the reference) in
f64 and f32, and compare its loss and gradients with torch autograd. This
module holds what they share: safetensors I/O, the case files, running
satdar, the comparison and its report, the fake satdar's command line, the
self-test loop and the drivers' common flags.

Needs only torch and numpy (Debian's python3-torch 1.13 at /usr/bin/python3).
"""

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from typing import (Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # pylint: disable=g-import-not-at-top,wrong-import-position

# Required relative accuracy of satdar's loss and gradients, by --dtype.
TOLERANCES = {'f64': 1e-9, 'f32': 1e-4}

# Tensor dtype satdar must write for each --dtype.
OUTPUT_DTYPES = {'f64': torch.float64, 'f32': torch.float32}

# ---------------------------------------------------------------------------
# Safetensors
# ---------------------------------------------------------------------------

# Safetensors dtype name -> (torch dtype, little-endian numpy dtype of the
# stored bits). numpy has no bfloat16, so BF16 travels as raw int16 bits.
_ST_DTYPES = {
    'F64': (torch.float64, np.dtype('<f8')),
    'F32': (torch.float32, np.dtype('<f4')),
    'F16': (torch.float16, np.dtype('<f2')),
    'BF16': (torch.bfloat16, np.dtype('<i2')),
    'I64': (torch.int64, np.dtype('<i8')),
    'I32': (torch.int32, np.dtype('<i4')),
}
_ST_NAMES = {torch_dtype: name
             for name, (torch_dtype, _) in _ST_DTYPES.items()}


def write_safetensors(path: str, tensors: Mapping[str, torch.Tensor],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors to a safetensors file.

    Layout: 8-byte little-endian header length, a JSON header (padded with
    spaces to a multiple of 8 bytes) mapping each name to its dtype, shape
    and [begin, end) offsets in the data section, then the raw little-endian
    data of the tensors, back to back in the order given.

    Args:
        path: output file.
        tensors: name -> tensor of a dtype in _ST_DTYPES.
        metadata: optional string -> string map stored as `__metadata__`.

    Raises:
        ValueError: a tensor has an unsupported dtype.
    """
    header = {}
    if metadata:
        header['__metadata__'] = dict(metadata)
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _ST_NAMES:
            raise ValueError(f'{name}: unsupported dtype {tensor.dtype}')
        st_name = _ST_NAMES[tensor.dtype]
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        blob = tensor.numpy().astype(_ST_DTYPES[st_name][1],
                                     copy=False).tobytes()
        header[name] = {'dtype': st_name, 'shape': list(tensor.shape),
                        'data_offsets': [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(',', ':')).encode('utf-8')
    header_bytes += b' ' * (-len(header_bytes) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(header_bytes)))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path: str
                     ) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Reads a safetensors file written by any conforming writer.

    Args:
        path: input file.

    Returns:
        (tensors, metadata): name -> tensor in file order, and the
        `__metadata__` map (empty when absent).

    Raises:
        ValueError: the file is truncated or malformed (unknown dtype, bad
            shape, offsets out of range or overlapping, size mismatch).
    """
    with open(path, 'rb') as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f'{path}: truncated (no header length)')
    (header_len,) = struct.unpack('<Q', raw[:8])
    if 8 + header_len > len(raw):
        raise ValueError(f'{path}: truncated header')
    try:
        header = json.loads(raw[8:8 + header_len].decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f'{path}: bad header JSON: {e}') from e
    if not isinstance(header, dict):
        raise ValueError(f'{path}: header is not a JSON object')
    data = raw[8 + header_len:]
    metadata = header.pop('__metadata__', None) or {}
    tensors = collections.OrderedDict()
    spans = []
    for name, info in header.items():
        dtype_name = info.get('dtype') if isinstance(info, dict) else None
        if dtype_name not in _ST_DTYPES:
            raise ValueError(f'{path}: {name}: unknown dtype {dtype_name!r}')
        torch_dtype, np_dtype = _ST_DTYPES[dtype_name]
        shape = info.get('shape')
        offsets = info.get('data_offsets')
        if (not isinstance(shape, list) or
                not all(isinstance(s, int) and s >= 0 for s in shape)):
            raise ValueError(f'{path}: {name}: bad shape {shape!r}')
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(isinstance(o, int) for o in offsets)):
            raise ValueError(f'{path}: {name}: bad data_offsets {offsets!r}')
        begin, end = offsets
        nbytes = math.prod(shape) * np_dtype.itemsize
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f'{path}: {name}: data_offsets {offsets} out of '
                             f'range (data section is {len(data)} bytes)')
        if end - begin != nbytes:
            raise ValueError(f'{path}: {name}: {end - begin} bytes for shape '
                             f'{shape} of {dtype_name}')
        spans.append((begin, end, name))
        array = np.frombuffer(data, dtype=np_dtype, count=math.prod(shape),
                              offset=begin).reshape(shape)
        tensor = torch.from_numpy(array.astype(array.dtype.newbyteorder('='),
                                                copy=True))
        if torch_dtype == torch.bfloat16:
            tensor = tensor.view(torch.bfloat16)
        tensors[name] = tensor
    spans.sort()
    for (_, prev_end, prev), (begin, _, name) in zip(spans, spans[1:]):
        if begin < prev_end:
            raise ValueError(f'{path}: {name} overlaps {prev}')
    return tensors, dict(metadata)


# ---------------------------------------------------------------------------
# Weights, tokens and autograd
# ---------------------------------------------------------------------------


def draw_weights(config: torch_model.ModelConfig, seed: int,
                 matrix_std: float, gain_std: float,
                 mixing_std: float = 0.0) -> Dict[str, torch.Tensor]:
    """One float64 draw of test weights (torch_model.init_weights).

    Drawn from one torch.Generator in named_parameters() order, so the result
    is a pure function of the arguments.

    Args:
        config: the model config.
        seed: generator seed.
        matrix_std: matrices are N(0, matrix_std).
        gain_std: norm gains are 1 + gain_std * N(0, 1).
        mixing_std: spread of the mixing parameters around their init.

    Returns:
        Section 5 name -> tensor, in named_parameters() order.
    """
    model = torch_model.CausalLM(config, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    torch_model.init_weights(model, matrix_std, generator, gain_std=gain_std,
                             mixing_std=mixing_std)
    return collections.OrderedDict(
        (name, p.detach().clone()) for name, p in model.named_parameters())


def random_tokens(vocab_size: int, seed: int, dtype: torch.dtype,
                  batch: int, seq_len: int) -> torch.Tensor:
    """Uniform random ids in [0, vocab_size), [batch, seq_len + 1]."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch, seq_len + 1),
                           generator=generator, dtype=torch.int64)
    return tokens.to(dtype)


def build_model(config: torch_model.ModelConfig,
                weights: Mapping[str, torch.Tensor],
                dtype: torch.dtype = torch.float64) -> torch_model.CausalLM:
    """The reference model holding `weights` (strict: every name, no more)."""
    model = torch_model.CausalLM(config, dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()},
                          strict=True)
    return model


def autograd_grads(config: torch_model.ModelConfig,
                   weights: Mapping[str, torch.Tensor],
                   tokens: torch.Tensor,
                   dtype: torch.dtype = torch.float64
                   ) -> Dict[str, torch.Tensor]:
    """Loss and gradients by torch autograd, named like `satdar grad` output.

    A parameter the loss does not use gets a zero gradient.

    Args:
        config: the model config.
        weights: name -> tensor (any float dtype).
        tokens: [B, T+1] integer ids.
        dtype: precision of the computation.

    Returns:
        `loss` ([1]) and `grad.<name>` for every weight, all of dtype.
    """
    model = build_model(config, weights, dtype)
    loss = model.loss(tokens)
    loss.backward()
    result = collections.OrderedDict(loss=loss.detach().reshape(1))
    for name, param in model.named_parameters():
        grad = param.grad
        result['grad.' + name] = (torch.zeros_like(param) if grad is None
                                  else grad.detach().clone())
    return result


# ---------------------------------------------------------------------------
# Case files and running satdar
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class CaseFiles:
    """Paths of one case's inputs in the work directory."""
    config: str
    weights: str
    tokens: str


def write_case_files(name: str, config: Mapping[str, object],
                     weights: Mapping[str, torch.Tensor],
                     tokens: torch.Tensor, workdir: str) -> CaseFiles:
    """Writes a case's config JSON, weights and tokens; returns the paths."""
    files = CaseFiles(
        config=os.path.join(workdir, f'{name}.config.json'),
        weights=os.path.join(workdir, f'{name}.weights.safetensors'),
        tokens=os.path.join(workdir, f'{name}.tokens.safetensors'))
    with open(files.config, 'w') as f:
        json.dump(config, f, indent=2)
        f.write('\n')
    write_safetensors(files.weights, weights, metadata={'format': 'pt'})
    write_safetensors(files.tokens, {'tokens': tokens})
    return files


def load_case(files: CaseFiles
              ) -> Tuple[torch_model.ModelConfig, Dict[str, torch.Tensor],
                         torch.Tensor]:
    """Reads a case back from its files: (config, weights, tokens)."""
    with open(files.config) as f:
        config = torch_model.ModelConfig.from_dict(json.load(f))
    weights, _ = read_safetensors(files.weights)
    tokens, _ = read_safetensors(files.tokens)
    return config, weights, tokens['tokens']


def run_satdar_grad(satdar: str, files: CaseFiles, dtype: str, out: str,
                    threads: int, timeout: float) -> Optional[str]:
    """Runs `satdar grad`; returns None on success, else an error message."""
    command = [satdar, 'grad', '--config', files.config,
               '--weights', files.weights, '--tokens', files.tokens,
               '--out', out, '--dtype', dtype, '--threads', str(threads)]
    if os.path.exists(out):
        os.remove(out)
    try:
        proc = subprocess.run(command, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f'could not run {" ".join(command)}: {e}'
    if proc.returncode != 0:
        return (f'{" ".join(command)} exited with {proc.returncode}\n'
                f'--- stderr ---\n{proc.stderr.rstrip()}')
    return None


# runner(files, dtype, out_path) -> None on success, else an error message.
Runner = Callable[[CaseFiles, str, str], Optional[str]]


def satdar_runner(satdar: str, threads: int, timeout: float) -> Runner:
    """A Runner invoking the satdar binary."""
    def run(files, dtype, out):
        return run_satdar_grad(satdar, files, dtype, out, threads, timeout)
    return run


# ---------------------------------------------------------------------------
# Comparing and reporting
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Comparison:
    """Result of comparing satdar's output with the reference.

    Attributes:
        errors: tensor name -> relative error, for tensors in both.
        problems: structural problems (missing, extra, dtype, shape).
    """
    errors: Dict[str, float]
    problems: List[str]

    def worst(self) -> Tuple[str, float]:
        """(name, error) of the least accurate tensor; ('-', nan) if none."""
        if not self.errors:
            return '-', float('nan')
        name = max(self.errors, key=lambda n: self.errors[n])
        return name, self.errors[name]

    def passed(self, tol: float) -> bool:
        # `not err > tol` also fails NaN errors.
        return not self.problems and bool(self.errors) and all(
            err <= tol for err in self.errors.values())


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|actual - expected| / max(max|expected|, 1e-30), in float64."""
    actual, expected = actual.double(), expected.double()
    if expected.numel() == 0:
        return 0.0
    scale = max(float(expected.abs().max()), 1e-30)
    diff = float((actual - expected).abs().max())
    return diff / scale if math.isfinite(diff) else math.inf


def compare(actual: Mapping[str, torch.Tensor],
            expected: Mapping[str, torch.Tensor],
            dtype: torch.dtype) -> Comparison:
    """Compares satdar's tensors with the reference ones, name by name."""
    result = Comparison(errors={}, problems=[])
    for name in expected:
        if name not in actual:
            result.problems.append(f'missing tensor {name}')
    for name, tensor in actual.items():
        if name not in expected:
            result.problems.append(f'unexpected tensor {name}')
            continue
        if tensor.dtype != dtype:
            result.problems.append(f'{name}: dtype {tensor.dtype}, '
                                   f'expected {dtype}')
        if tuple(tensor.shape) != tuple(expected[name].shape):
            result.problems.append(f'{name}: shape {list(tensor.shape)}, '
                                   f'expected {list(expected[name].shape)}')
            continue
        result.errors[name] = relative_error(tensor, expected[name])
    return result


# compare_fn(actual, expected, dtype) -> Comparison; `compare` or a variant.
CompareFn = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor],
                      torch.dtype], Comparison]


def check_outputs(name: str, files: CaseFiles,
                  expected: Mapping[str, torch.Tensor], runner: Runner,
                  workdir: str, compare_fn: CompareFn = compare,
                  max_problems: Optional[int] = None) -> List[bool]:
    """Runs a written case in every dtype, prints a line each (see below).

    Each dtype prints `PASS|FAIL name dtype: worst NAME rel_err X (tol T)`,
    then the structural problems (the first max_problems of them; all when
    None) and, on failure, the (up to 8) worst tensors beyond the tolerance;
    or `FAIL name dtype: ERROR` when satdar failed or its output is
    unreadable.

    Args:
        name: the case name (file names and the report).
        files: the case's input files.
        expected: the reference `loss` and `grad.<name>` tensors.
        runner: runs satdar (or a stand-in) on the files.
        workdir: where the outputs go.
        compare_fn: compares the output with `expected`.
        max_problems: how many structural problems to print; None: all.

    Returns:
        A pass flag per dtype, in TOLERANCES order.
    """
    outcomes = []
    for dtype, tol in TOLERANCES.items():
        out = os.path.join(workdir, f'{name}.grad.{dtype}.safetensors')
        if os.path.exists(out):
            os.remove(out)
        error = runner(files, dtype, out)
        if error is None:
            try:
                actual, _ = read_safetensors(out)
            except (OSError, ValueError) as e:
                error = str(e)
        if error is not None:
            print(f'FAIL {name} {dtype}: {error}')
            outcomes.append(False)
            continue
        result = compare_fn(actual, expected, OUTPUT_DTYPES[dtype])
        ok = result.passed(tol)
        worst_name, err = result.worst()
        print(f'{"PASS" if ok else "FAIL"} {name} {dtype}: '
              f'worst {worst_name} rel_err {err:.3e} (tol {tol:.0e})')
        for problem in result.problems[:max_problems]:
            print(f'    {problem}')
        if not ok:
            bad = sorted(((e, n) for n, e in result.errors.items()
                          if not e <= tol), reverse=True)
            for e, n in bad[:8]:
                print(f'    {n}: rel_err {e:.3e}')
        outcomes.append(ok)
    return outcomes


# ---------------------------------------------------------------------------
# A fake satdar built on a reference (for --self-test)
# ---------------------------------------------------------------------------


def fake_satdar_main(argv: List[str],
                     grads: Callable[[CaseFiles, str],
                                     Mapping[str, torch.Tensor]]) -> int:
    """`satdar grad` command line writing grads(files, dtype).

    Args:
        argv: the command line after the program name.
        grads: what the fake computes from the case files and --dtype.

    Returns:
        The process exit status.
    """
    parser = argparse.ArgumentParser(prog='fake-satdar')
    parser.add_argument('command', choices=['grad'])
    for flag in ('--config', '--weights', '--tokens', '--out'):
        parser.add_argument(flag, required=True)
    parser.add_argument('--dtype', choices=sorted(OUTPUT_DTYPES),
                        default='f32')
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    files = CaseFiles(args.config, args.weights, args.tokens)
    write_safetensors(args.out, grads(files, args.dtype))
    return 0


def write_fake_satdar(path: str, module: str, mode: str) -> str:
    """Writes an executable running `module`.fake_satdar_main(argv, mode).

    Args:
        path: the executable to write.
        module: a module in this directory with a fake_satdar_main.
        mode: passed on as fake_satdar_main's mode.

    Returns:
        path.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    with open(path, 'w') as f:
        f.write(f'#!{sys.executable}\n'
                'import sys\n'
                f'sys.path.insert(0, {here!r})\n'
                f'import {module}\n'
                f'sys.exit({module}.fake_satdar_main(\n'
                f'    sys.argv[1:], mode={mode!r}))\n')
    os.chmod(path, 0o755)
    return path


# ---------------------------------------------------------------------------
# Self-test loop and the drivers' main
# ---------------------------------------------------------------------------


def run_quietly(log: io.StringIO,
                fn: Callable[[], List[bool]]) -> List[bool]:
    """fn(), with what it prints going to log instead of stdout."""
    with contextlib.redirect_stdout(log):
        return fn()


# (name, check): check(workdir) returns a detail line or raises.
SelfTest = Tuple[str, Callable[[str], str]]


def run_self_tests(tests: Sequence[SelfTest],
                   workdir: str) -> Tuple[int, int]:
    """Runs the checks, printing a line each; returns (passed, failed)."""
    passed = failed = 0
    for name, check in tests:
        try:
            detail = check(workdir)
        except Exception as e:  # pylint: disable=broad-except
            print(f'FAIL self-test {name}: {type(e).__name__}: {e}')
            failed += 1
        else:
            print(f'PASS self-test {name}: {detail}', flush=True)
            passed += 1
    return passed, failed


def argument_parser(
        doc: str,
        add_flags: Optional[Callable[[argparse.ArgumentParser], None]] = None
) -> argparse.ArgumentParser:
    """The drivers' command line: --satdar, --workdir, --threads, --timeout,
    any flags add_flags adds, then --self-test.

    Args:
        doc: the driver's module docstring; its first paragraph describes it.
        add_flags: adds the driver's own flags.

    Returns:
        The parser.
    """
    parser = argparse.ArgumentParser(
        description=doc.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--satdar', help='path of the satdar binary')
    parser.add_argument('--workdir',
                        help='directory for inputs and outputs (created if '
                        'missing; a temporary one for --self-test if unset)')
    parser.add_argument('--threads', type=int, default=2,
                        help='--threads passed to satdar (default 2)')
    parser.add_argument('--timeout', type=float, default=600,
                        help='seconds allowed per satdar run (default 600)')
    if add_flags is not None:
        add_flags(parser)
    parser.add_argument('--self-test', action='store_true',
                        help='check the reference itself; satdar not needed')
    return parser


def run_driver(workdir: Optional[str], prefix: str,
               run: Callable[[str], Tuple[int, int]]) -> int:
    """Runs the checks in a work directory and prints `N passed, M failed`.

    Args:
        workdir: --workdir (created if missing); None: a temporary directory.
        prefix: name prefix of the temporary directory.
        run: runs the cases or self-tests in a directory: (passed, failed).

    Returns:
        The exit status: 1 if any check failed, else 0.
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        workdir = workdir or tmp
        os.makedirs(workdir, exist_ok=True)
        passed, failed = run(workdir)
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


def tally(outcomes: Sequence[bool]) -> Tuple[int, int]:
    """(passed, failed) of pass flags."""
    passed = sum(outcomes)
    return passed, len(outcomes) - passed
