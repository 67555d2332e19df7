"""Params whose every value names its version and tensor, so a torn or mixed version shows."""

from __future__ import annotations

import numpy as np


def params_for(version: int) -> dict:
    """Small params (7 tensors); tensor i of version v holds the value 100 * v + i everywhere."""
    shapes = {"embed": {"tokens": (32, 8)}, "layers": {"0": {"w": (8, 16), "b": (16,)}, "1": {"w": (8, 16), "b": (16,)}},
              "norm": {"scale": (8,)}}
    out, index = {}, 0

    def fill(node, dest):
        nonlocal index
        for key in sorted(node):
            if isinstance(node[key], dict):
                fill(node[key], dest.setdefault(key, {}))
            else:
                dest[key] = np.full(node[key], version * 100 + index, np.float32)
                index += 1

    fill(shapes, out)
    out["step"] = np.array([version], np.int32)
    return out


def assert_is_version(params: dict, version: int) -> None:
    expected = params_for(version)

    def check(got, want, path):
        assert set(got) == set(want), path
        for key in want:
            if isinstance(want[key], dict):
                check(got[key], want[key], f"{path}/{key}")
            else:
                np.testing.assert_array_equal(np.asarray(got[key], np.float64), np.asarray(want[key], np.float64),
                                              err_msg=f"{path}/{key}")

    check(params, expected, "")
