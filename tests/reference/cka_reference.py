#!/usr/bin/python3
"""Checks CKA matrices written by satdar against linear CKA recomputed with PyTorch (float64).

Inputs:

  --states F.npy   float64 array of shape (S, n, d): S hidden states, each n examples x d
                   features (the same n examples for every state).
  --json F.json    {"states":   [{"stream": int, "depth": int}, ...]   (S entries, one per
                                                                        state of the .npy),
                    "matrices": {"sA-sB": [[...], ...], ...}}

A matrix named "sA-sB" holds, at row i and column j, the linear CKA (Kornblith et al. 2019)
between the i-th state of stream A and the j-th state of stream B, the states of a stream
ordered by depth:

    CKA(X, Y) = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)

with every column centred over the n examples. A column whose values are all equal is centred
to exact zeros, and a state whose self term ||Xc^T Xc||_F is 0 (a constant state) has CKA NaN,
as in runtime/cka.h; NaN is written to JSON as NaN or null. Every element must be within 1e-9
of the reference (NaN only where the reference is NaN).

Prints one "ok ..." line per matrix; exits 1 with a message naming the matrix and element at
the first mismatch, or on malformed input.

Usage:
    /usr/bin/python3 cka_reference.py --states states.npy --json cka.json
"""
import argparse
import json
import math
import re
import sys
from typing import Dict, List, Optional

import numpy
import torch

TOLERANCE = 1e-9


class CheckError(Exception):
    """A malformed input or a mismatch; its text is the message printed."""


def centred(x: torch.Tensor) -> torch.Tensor:
    xc = x - x.mean(dim=0, keepdim=True)
    constant = (x == x[0:1]).all(dim=0)
    xc[:, constant] = 0.0
    return xc


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    xc, yc = centred(x), centred(y)
    cross = torch.linalg.matrix_norm(yc.T @ xc) ** 2
    norm_x = torch.linalg.matrix_norm(xc.T @ xc)
    norm_y = torch.linalg.matrix_norm(yc.T @ yc)
    denominator = float(norm_x * norm_y)
    if not denominator > 0.0:
        return math.nan
    return float(cross) / denominator


def stream_order(states_meta: list, count: int) -> Dict[int, List[int]]:
    """Stream -> indices of its states in the .npy, ordered by depth."""
    if not isinstance(states_meta, list) or len(states_meta) != count:
        raise CheckError(f'json "states" must list {count} entries (one per state of the .npy), '
                         f'got {len(states_meta) if isinstance(states_meta, list) else states_meta!r}')
    by_stream: Dict[int, List[tuple]] = {}
    for index, meta in enumerate(states_meta):
        if (not isinstance(meta, dict) or not isinstance(meta.get('stream'), int)
                or not isinstance(meta.get('depth'), int)):
            raise CheckError(f'json "states"[{index}] must be {{"stream": int, "depth": int}}, '
                             f'got {meta!r}')
        by_stream.setdefault(meta['stream'], []).append((meta['depth'], index))
    order = {}
    for stream, entries in by_stream.items():
        entries.sort()
        depths = [depth for depth, _ in entries]
        if len(set(depths)) != len(depths):
            raise CheckError(f'json "states": stream {stream} has a repeated depth ({depths})')
        order[stream] = [index for _, index in entries]
    return order


def as_float(value, where: str) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckError(f'{where} is not a number: {value!r}')
    return float(value)


def check_matrix(name: str, matrix, states: torch.Tensor, order: Dict[int, List[int]]) -> str:
    match = re.fullmatch(r's(\d+)-s(\d+)', name)
    if match is None:
        raise CheckError(f'json "matrices": name {name!r} is not of the form "sA-sB"')
    a, b = int(match.group(1)), int(match.group(2))
    for stream in (a, b):
        if stream not in order:
            raise CheckError(f'matrix {name}: stream {stream} has no states in json "states" '
                             f'(streams: {sorted(order)})')
    rows, cols = order[a], order[b]
    if (not isinstance(matrix, list) or len(matrix) != len(rows)
            or any(not isinstance(row, list) or len(row) != len(cols) for row in matrix)):
        raise CheckError(f'matrix {name}: expected {len(rows)} rows of {len(cols)} values '
                         f'(the depths of streams {a} and {b})')
    worst = 0.0
    for i, si in enumerate(rows):
        for j, sj in enumerate(cols):
            got = as_float(matrix[i][j], f'matrix {name}[{i}][{j}]')
            want = linear_cka(states[si], states[sj])
            if math.isnan(want) or math.isnan(got):
                if math.isnan(want) != math.isnan(got):
                    raise CheckError(f'matrix {name}[{i}][{j}] (states {si} and {sj}): got {got}, '
                                     f'reference {want}')
                continue
            diff = abs(got - want)
            if not diff < TOLERANCE:
                raise CheckError(f'matrix {name}[{i}][{j}] (states {si} and {sj}): got {got!r}, '
                                 f'reference {want!r}, |diff| {diff:.3g} >= {TOLERANCE:g}')
            worst = max(worst, diff)
    return f'ok {name}: {len(rows)}x{len(cols)}, max |diff| {worst:.3g}'


def run(states_path: str, json_path: str) -> None:
    try:
        array = numpy.load(states_path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CheckError(f'cannot read --states {states_path}: {e}')
    if array.ndim != 3 or array.dtype != numpy.float64:
        raise CheckError(f'--states {states_path}: expected a float64 array of shape (S, n, d), '
                         f'got {array.dtype} {array.shape}')
    try:
        with open(json_path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckError(f'cannot read --json {json_path}: {e}')
    if not isinstance(doc, dict) or not isinstance(doc.get('matrices'), dict):
        raise CheckError(f'--json {json_path}: expected an object with "matrices" (an object) '
                         f'and "states"')
    order = stream_order(doc.get('states'), array.shape[0])
    if not doc['matrices']:
        raise CheckError(f'--json {json_path}: "matrices" is empty')
    states = torch.from_numpy(array)
    for name in sorted(doc['matrices']):
        print(check_matrix(name, doc['matrices'][name], states, order), flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--states', required=True, help='.npy, float64, shape (S, n, d)')
    parser.add_argument('--json', required=True, help='JSON with "states" and "matrices"')
    args = parser.parse_args(argv)
    try:
        run(args.states, args.json)
    except CheckError as e:
        print(f'FAIL cka_reference: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
