"""Figures are readable at the size the site shows them (kernels_src.figures.readability): no text under
MIN_PX pixels once the PNG is scaled to the page's width, and no legend over a data point. Checked on the
figures the book draws through kernels_src (the course map, the byte layouts, the rooflines of committed
measurements, the still pictures of the interactive figures); the measure itself is shown to fail first."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from kernels_src.figures import controls, readability  # noqa: E402
from kernels_src.figures.readability import legend_over_data, too_small  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


# -------------------------------------------------------------------------------------- the measure fails
def test_a_wide_figure_with_small_text_is_too_small():
    fig, ax = plt.subplots(figsize=(15, 4))
    ax.set_title("a title", fontsize=10)
    ax.text(0.5, 0.5, "tiny", fontsize=7)
    small = dict((s, px) for px, s in too_small(fig))
    # 15 in at 100 dpi (about 13 in once trimmed) is shown at 688 px: 7 pt is under 7 px
    assert "tiny" in small and small["tiny"] < 7
    assert "a title" in small  # 10 pt shrinks to under 8 px


def test_a_figure_at_page_width_with_8pt_text_passes():
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.text(0.5, 0.5, "fine", fontsize=8)
    ax.tick_params(labelsize=8)
    assert too_small(fig) == []


def test_a_legend_over_a_point_is_seen():
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([1, 2, 3], [1, 2, 3], "o", label="diagonal")
    ax.plot([2.95], [1.05], "s", label="under the legend")
    ax.legend(loc="lower right")
    assert any("under the legend" in f for f in legend_over_data(fig))
    ax.legend(loc="upper left")
    assert legend_over_data(fig) == []


# ------------------------------------------------------------------------------------ the book's figures
def _course_map():
    from kernels_src.figures import course_map

    return course_map.draw().figure


def _byte_layout():
    from kernels_src.figures import quant

    return quant.plot_byte_layout().figure


def _roofline(op, size=None):
    def draw():
        from kernels_src import plots

        res = plots.load_bench(f"h100/{op}_gpu")
        return plots.roofline([res], title=f"{op} rungs on {plots.device_label(res)}", size=size).figure
    return draw


def _error_model():
    from kernels_src.figures import quant
    from kernels_src.ops import quant_error

    return quant.plot_error_model(quant_error.chapter_weights())[0].figure


def _gelu_approx():
    from kernels_src.figures import rowwise

    return rowwise.plot_gelu_approx()[0].figure


def _activation_roofline():
    from kernels_src import plots
    from kernels_src.figures import rowwise

    acts = rowwise.available(["relu", "gelu", "gelu_bwd", "silu"]) + [plots.load_bench("h100/bias_gelu_gpu")]
    return rowwise.activation_roofline(acts, title="chapter 6")[0].figure


def _moe_load():
    from kernels_src.figures import moe

    res = moe.load()
    if res is None:
        pytest.skip("no committed MoE training run to draw")
    return moe.plot_load(res)


FIGURES = {"course_map": _course_map, "moe_load": _moe_load, "byte_layout": _byte_layout, "error_model": _error_model,
           "gelu_approx": _gelu_approx, "activation_roofline": _activation_roofline,
           "roofline_attention": _roofline("attention", (4, 16, 16, 2048, 2048, 64, 0)),
           "roofline_softmax": _roofline("softmax"), "roofline_gemv": _roofline("gemv")}


@pytest.mark.parametrize("name", FIGURES)
def test_book_figure_is_readable_at_page_width(name):
    fig = FIGURES[name]()
    assert too_small(fig) == [], f"{name}: text under {readability.MIN_PX} px on the page"
    assert legend_over_data(fig) == []


def _still_pictures(make, monkeypatch):
    """The figures an interactive figure draws for the site (its still picture)."""
    import IPython.display

    figs = []
    monkeypatch.setenv(controls.BOOK_ENV, "1")
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: None)
    monkeypatch.setattr(plt, "show", lambda *a, **k: figs.extend(plt.figure(n) for n in plt.get_fignums()))
    make()
    return figs


@pytest.mark.parametrize("name", ["regression.explorer", "gemm.explorer", "quant.histogram_widget",
                                  "rope.rotation_widget", "attention.attention_widget"])
def test_still_picture_of_an_interactive_figure_is_readable(name, monkeypatch):
    from tests.test_figure_controls import FIGURES as INTERACTIVE

    figs = _still_pictures(INTERACTIVE[name], monkeypatch)
    assert figs, f"{name} drew nothing for the site"
    for fig in figs:
        assert too_small(fig) == [], f"{name}: text under {readability.MIN_PX} px on the page"
        assert legend_over_data(fig) == []
