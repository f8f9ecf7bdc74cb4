"""What the examples show besides their printed results: a progress bar, a plot, a video.

Each uses an optional package of the ``examples`` extra (``pip install -e ".[examples]"``): tqdm,
matplotlib (Agg backend, no display), imageio; the video also needs an OpenGL context for
``mujoco.Renderer`` (headless: ``MUJOCO_GL=egl`` or ``osmesa``, read when ``mujoco`` is imported).
When a package or the context is missing, the function prints one line saying what it skipped and
why, and the example goes on.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time
from typing import Mapping, Sequence

import mujoco
import numpy as np

EXTRA = 'pip install -e ".[examples]"'
DEFAULT_OUT = pathlib.Path(__file__).parent / "out"


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every example shares: where its files go, and whether to render a video."""
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help="directory for the plot and the video (default: optim_examples/out)")
    parser.add_argument("--no-video", action="store_true", help="skip rendering the video")


def _skipped(what: str, why: str) -> None:
    print(f"{what} skipped: {why}", flush=True)


class Progress:
    """A progress bar over ``total`` steps: tqdm's when installed, else a printed line every
    twentieth of the way (and at the end).

    ``update(**values)`` advances one step and shows the values (e.g. cost=12.3); ``close()`` ends
    the bar. Usable as a context manager.
    """

    def __init__(self, total: int, description: str):
        self.total, self.description, self.count = total, description, 0
        self.start = time.perf_counter()
        try:
            import tqdm
        except ImportError:
            self.bar = None
            print(f"{description}: {total} steps (install tqdm for a progress bar)", flush=True)
        else:
            self.bar = tqdm.tqdm(total=total, desc=description, dynamic_ncols=True)

    def update(self, **values: float) -> None:
        self.count += 1
        shown = {name: f"{value:.6g}" if isinstance(value, float) else value for name, value in values.items()}
        if self.bar is not None:
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update()
        elif self.count % max(1, self.total // 20) == 0 or self.count == self.total:
            fields = "  ".join(f"{name} {value}" for name, value in shown.items())
            print(f"{self.description} {self.count}/{self.total}  {fields}  "
                  f"{time.perf_counter() - self.start:.1f}s", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save_plot(path: pathlib.Path, title: str, cost: Mapping[str, Sequence[float]], cost_xlabel: str,
              times: np.ndarray, curves: Mapping[str, np.ndarray]) -> pathlib.Path | None:
    """A PNG with two panels: cost curves (log scale) and trajectory curves against time.

    cost: label -> values [n] (each plotted against 0 .. n - 1). times [T] in seconds; curves: label ->
    values [T].
    Returns the path written, or None when matplotlib is not installed.
    """
    plt = _pyplot()
    if plt is None:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, values in cost.items():
        left.plot(np.arange(len(values)), np.asarray(values), label=label)
    left.set(yscale="log", xlabel=cost_xlabel, ylabel="cost", title="cost")
    for label, values in curves.items():
        right.plot(times, np.asarray(values), label=label)
    right.set(xlabel="time (s)", title="trajectory")
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend()
    return _save_figure(plt, figure, path, title)


def save_curves(path: pathlib.Path, title: str,
                panels: Sequence[tuple[str, str, str, Mapping[str, tuple[np.ndarray, np.ndarray]]]]) -> pathlib.Path | None:
    """A PNG of line plots side by side, one panel per (title, xlabel, ylabel, curves) with curves: label
    -> (x [n], y [n]) (e.g. learning curves: return against wall time and against simulator steps).

    Returns the path written, or None when matplotlib is not installed.
    """
    plt = _pyplot()
    if plt is None:
        return None
    columns = min(len(panels), 2)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
    for panel, (panel_title, xlabel, ylabel, curves) in zip(axes.flat, panels):
        for label, (x, y) in curves.items():
            panel.plot(np.asarray(x), np.asarray(y), marker=".", label=label)
        panel.set(xlabel=xlabel, ylabel=ylabel, title=panel_title)
        panel.grid(alpha=0.3)
        panel.legend()
    for unused in axes.flat[len(panels):]:
        unused.set_visible(False)
    return _save_figure(plt, figure, path, title)


def _pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or None (and a line saying so)
    when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        _skipped("plot", f"matplotlib is not installed ({EXTRA})")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(plt, figure, path: pathlib.Path, title: str) -> pathlib.Path:
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    print(f"plot: {path}", flush=True)
    return path


def save_video(path: pathlib.Path, mj_model: mujoco.MjModel, qpos: np.ndarray, *, camera: str | int = -1,
               fps: float = 25, width: int = 480, height: int = 360) -> pathlib.Path | None:
    """A GIF, in real time, of the poses qpos [T, nq] one ``mj_model.opt.timestep`` apart, rendered by
    ``mujoco.Renderer`` (every pose nearest a frame of ``fps`` frames per second).

    camera: a camera of the model (name or id; -1: the free camera). Returns the path written, or None
    when no OpenGL context could be made (see ``MUJOCO_GL``) or imageio is not installed.
    """
    data = mujoco.MjData(mj_model)
    try:
        renderer = mujoco.Renderer(mj_model, height, width)
    # a missing GL backend fails in many ways (FatalError, ImportError, AttributeError in PyOpenGL, ...)
    except Exception as error:  # noqa: BLE001
        backend = os.environ.get("MUJOCO_GL") or "glfw, the default"
        _skipped("video", f"mujoco.Renderer has no OpenGL context (MUJOCO_GL={backend}; headless machines "
                 f"need MUJOCO_GL=egl or osmesa): {type(error).__name__}: {error}")
        return None
    every = max(1, round(1 / (fps * mj_model.opt.timestep)))
    frames = []
    with renderer:
        for pose in qpos[::every]:
            data.qpos[:] = pose
            mujoco.mj_forward(mj_model, data)
            renderer.update_scene(data, camera)
            frames.append(renderer.render())
    try:
        import imageio.v3 as imageio
    except ImportError:
        _skipped("video", f"imageio is not installed ({EXTRA})")
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.imwrite(path, np.stack(frames), duration=1000 * every * mj_model.opt.timestep, loop=0)
    print(f"video: {path} ({len(frames)} frames)", flush=True)
    return path
