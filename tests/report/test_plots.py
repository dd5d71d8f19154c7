"""The plotly layer both reports draw with: escaping for HTML and for plotly text, the
JSON blocks figures travel in, the page shell with plotly.js inlined once, and plotly
imported only when a page is drawn."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ledgerlm.report.plots import (
    CONFIG,
    HEIGHT,
    axis,
    e,
    figure,
    figure_html,
    layout,
    legend_height,
    lines,
    log_y_buttons,
    page,
    run_dash,
    t,
)
from report_helpers import figure_blocks, figures, plotlyjs, without_plotlyjs

NASTY = "</script><script>alert(1)</script> & <b>bold</b>"


def nasty_figure():
    return figure(
        [{"type": "scatter", "x": [1, 2], "y": [3, 4], "name": t(NASTY)}],
        layout(axis("tokens"), axis(t(f"{NASTY} (nat/token)")), log_toggle=True),
    )


def test_escaping_for_html_and_for_plotly_text() -> None:
    assert e('<a href="x">&') == "&lt;a href=&quot;x&quot;&gt;&amp;"
    assert t('<a href="x">&') == '&lt;a href="x"&gt;&amp;'  # plotly text has no attributes
    assert t(3) == "3"


def test_long_text_is_wrapped_and_escaped_per_line() -> None:
    assert lines("short") == "short"
    assert lines("a-20261201-210630-9a69", 20) == "a-20261201-210630-<br>9a69"  # after a hyphen
    assert lines("<b>x</b> & <i>y</i>", 10) == "&lt;b&gt;x&lt;/b&gt; &amp;<br>&lt;i&gt;y&lt;/i&gt;"
    assert lines("x" * 25, 10) == "xxxxxxxxxx<br>xxxxxxxxxx<br>xxxxx"  # a word too long
    assert lines("") == ""


def test_a_figure_grows_with_its_legend() -> None:
    def fig(*names: str, shapes=()):
        data = [{"type": "scatter", "x": [1], "y": [1], "name": n} for n in names]
        return figure(data, layout(axis("tokens"), axis("loss (nat/token)"), shapes=list(shapes)))

    one = fig("run")
    assert one.layout.showlegend is False and one.layout.height == HEIGHT  # nothing to tell
    target = {"type": "line", "y0": 1, "y1": 1, "name": "target 1", "showlegend": True}
    both = fig("run", shapes=[target])
    assert both.layout.showlegend is True
    assert both.layout.height == HEIGHT + legend_height(["run", "target 1"], 1e9)  # one row
    many = fig(*(lines(f"run {i} " + "x" * 50) for i in range(6)))
    assert many.layout.height > both.layout.height + 6 * 2 * 16  # six entries of 2 lines
    # plotly's packing: each entry as wide as the widest once they do not fit on a row
    assert legend_height(["a", "b", "c"], 1e9) == legend_height(["a"], 1e9)
    assert legend_height(["a", "b", "c" * 30], 300) == 3 * legend_height(["a"], 300)
    assert legend_height([], 300) == 0


def test_a_figure_travels_as_json_no_string_can_break_out_of() -> None:
    html = figure_html("nasty-1", nasty_figure())
    assert html.startswith('<div class="figure" id="figure-nasty-1" data-figure="nasty-1"></div>')
    (text,) = figure_blocks(html).values()
    assert not {"<", ">", "&"} & set(text)  # \\u003c, \\u003e, \\u0026 instead
    spec = json.loads(text)
    assert spec["data"][0]["name"] == t(NASTY)  # plotly decodes the entities and shows them
    assert spec["layout"]["yaxis"]["title"]["text"] == t(f"{NASTY} (nat/token)")
    assert spec["config"] == {
        **CONFIG,
        "toImageButtonOptions": {"format": "svg", "filename": "nasty-1"},
    }
    assert spec["config"]["responsive"] is True
    assert spec["layout"]["autosize"] is True and "width" not in spec["layout"]
    assert spec["layout"]["updatemenus"] == json.loads(json.dumps(log_y_buttons()))
    for bad in ("Nasty", "a b", "-a", "", 'a"><script>'):
        with pytest.raises(ValueError, match="figure name"):
            figure_html(bad, nasty_figure())


def test_numbers_are_plain_json_and_nan_is_a_gap() -> None:
    np = pytest.importorskip("numpy")
    fig = figure([{"type": "scatter", "x": np.arange(3), "y": [1.0, float("nan"), None]}],
                 layout(axis("tokens"), axis("loss (nat/token)")))  # fmt: skip
    (spec,) = figures(figure_html("f", fig)).values()
    assert spec["data"][0]["y"] == [1.0, None, None]


def test_the_page_inlines_plotlyjs_once_and_draws_every_figure() -> None:
    body = figure_html("one", nasty_figure()) + figure_html("two", nasty_figure())
    html = page("<title> & more", body)
    head, rest = html.split("</head>")
    assert html.count(plotlyjs()) == 1 and plotlyjs() in head  # offline, no CDN
    assert "<title>&lt;title&gt; &amp; more</title>" in head
    own = without_plotlyjs(html)
    assert 'src="http' not in html and "src=" not in own
    # plotly.js, two JSON blocks, and last the script handing each block to plotly
    assert own.count("<script") == 4
    assert rest.rstrip().endswith("</script></body></html>")
    assert "Plotly.newPlot" in rest.split("<script")[-1]
    assert list(figures(html)) == ["one", "two"]
    assert run_dash(0) == "solid" and run_dash(10) == "dash"


def test_importing_the_reports_does_not_import_plotly() -> None:
    code = (
        "import sys, ledgerlm.report.run.page, ledgerlm.report.scaling_report; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'plotly'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
