"""Interactive figures (kernels_src.figures.controls): a live widget in a notebook, a still picture with a caption
while the book is built, never a saved widget that would be drawn on the site as a control that does nothing."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kernels_src.figures import controls  # noqa: E402


def _regression():
    from kernels_src.figures import regression

    x = np.linspace(-1, 1, 16)
    return regression.explorer(x, 2 * x + 1)


def _gemm():
    from kernels_src.figures import gemm

    return gemm.explorer(M=64, N=64, K=64)


def _quant():
    from kernels_src.figures import quant

    return quant.histogram_widget()


def _rope():
    from kernels_src.figures import rope

    return rope.rotation_widget()


def _attention():
    from kernels_src.figures import attention

    return attention.attention_widget()


FIGURES = {"regression.explorer": _regression, "gemm.explorer": _gemm, "quant.histogram_widget": _quant,
           "rope.rotation_widget": _rope, "attention.attention_widget": _attention}


@pytest.fixture
def shown(monkeypatch):
    """What the figure displayed (IPython.display.display is replaced by a list append)."""
    import IPython.display
    import matplotlib.pyplot as plt

    out = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: out.extend(objs))
    monkeypatch.setattr(plt, "show", lambda *a, **k: plt.close("all"))
    return out


def _widget_count():
    from ipywidgets.widgets.widget import _instances

    return len(_instances)


@pytest.mark.parametrize("name", FIGURES)
def test_live_path_returns_a_working_widget(name, shown, monkeypatch, caplog):
    import ipywidgets

    monkeypatch.delenv(controls.BOOK_ENV, raising=False)
    live = FIGURES[name]()
    assert isinstance(live, ipywidgets.interactive), f"{name} returned {type(live)} in a notebook"
    assert live in shown, f"{name} did not display its widget"
    sliders = [c for c in live.children if isinstance(c, ipywidgets.ValueWidget)]
    assert sliders, f"{name} has no controls"
    # moving a control re-runs the figure without error
    c = sliders[-1]
    if isinstance(c, ipywidgets.Checkbox):
        c.value = not c.value
    elif hasattr(c, "options"):
        c.value = c.options[-1]
    else:
        c.value = c.max
    assert not _callback_errors(caplog), f"{name}: moving {c.description!r} raised: {_callback_errors(caplog)}"


def _callback_errors(caplog):
    # outside a kernel, ipywidgets logs an exception of the interact callback instead of showing it
    return [r.getMessage() for r in caplog.records if "Exception in interact callback" in r.getMessage()]


def test_a_failing_callback_would_be_seen(shown, monkeypatch, caplog):
    monkeypatch.delenv(controls.BOOK_ENV, raising=False)

    def draw(n=3):
        if n > 3:
            raise RuntimeError("boom")

    live = controls.interact(draw, lambda W: dict(n=W.IntSlider(value=3, max=9)))
    assert not _callback_errors(caplog)
    live.children[0].value = 9
    assert _callback_errors(caplog)


@pytest.mark.parametrize("name", FIGURES)
def test_book_build_draws_a_still_picture_and_no_widget(name, shown, monkeypatch):
    from IPython.display import Markdown

    monkeypatch.setenv(controls.BOOK_ENV, "1")
    before = _widget_count()
    assert FIGURES[name]() is None
    assert _widget_count() == before, f"{name} created a widget in the book build (it would be saved into the page)"
    captions = [o.data for o in shown if isinstance(o, Markdown)]
    assert captions and "Run this chapter in JupyterLab" in captions[-1], shown


def test_the_caption_names_the_starting_values_and_is_plain_markdown():
    def draw(block=32, lr=0.1, causal=True):
        pass

    text = controls.caption(draw, "move the sliders", {"lr": "learning rate"})
    assert "block = 32, learning rate = 0.1, causal = on" in text
    assert text.startswith("*") and text.endswith("*") and text.count("*") == 2


def test_a_control_that_does_not_start_at_the_default_is_refused(monkeypatch, shown):
    monkeypatch.delenv(controls.BOOK_ENV, raising=False)

    def draw(n=3):
        pass

    with pytest.raises(ValueError, match="starts at 5"):
        controls.interact(draw, lambda W: dict(n=W.IntSlider(value=5)))
    with pytest.raises(TypeError, match="needs a default"):
        controls.interact(lambda n: None, lambda W: dict(n=W.IntSlider(value=5)))


def test_static_mode_follows_the_environment(monkeypatch):
    monkeypatch.delenv(controls.BOOK_ENV, raising=False)
    assert not controls.static_mode()
    monkeypatch.setenv(controls.BOOK_ENV, "0")
    assert not controls.static_mode()
    monkeypatch.setenv(controls.BOOK_ENV, "1")
    assert controls.static_mode()


def test_the_site_extension_sets_the_environment(monkeypatch):
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv(controls.BOOK_ENV, "0")  # restored after the test, whatever setup() does
    path = Path(__file__).resolve().parents[1] / "book" / "_ext" / "kfs_site.py"
    spec = importlib.util.spec_from_file_location("kfs_site_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class App:  # Sphinx's application, as far as setup() is concerned: every call accepted, none acted on
        def __getattr__(self, name):
            return lambda *a, **k: None

    mod.setup(App())
    assert controls.static_mode()
