"""HTML for the dashboard: ``string.Template`` pages whose every value is escaped.

``render`` escapes each value it substitutes unless the value is ``Safe`` (HTML this
module built, itself from escaped parts), so job payloads, errors, queue and type
names, worker ids -- all user data -- can only ever land in a page as text. There is
no other way to put a value into a page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from string import Template
from typing import Any
from urllib.parse import urlencode


class Safe(str):
    """A string of HTML that is already safe to emit as is."""

    __slots__ = ()


def esc(value: object) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(html.escape("" if value is None else str(value), quote=True))


def render(template: str, **values: object) -> Safe:
    return Safe(Template(template).substitute({k: esc(v) for k, v in values.items()}))


def join(parts: Iterable[Safe]) -> Safe:
    return Safe("".join(esc(p) for p in parts))


def url(path: str, **query: object) -> str:
    """A path with its non-empty query parameters (escaped by ``render`` later)."""
    q = {k: str(v) for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urlencode(q) if q else "")


def pretty_json(value: Any) -> Safe:
    return render("<pre>$v</pre>", v=json.dumps(value, indent=2, sort_keys=True, default=str))


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str) -> Safe:
    head = join(render("<th>$h</th>", h=h) for h in headers)
    body = join(
        render("<tr>$cells</tr>", cells=join(render("<td>$c</td>", c=c) for c in row))
        for row in rows
    )
    if not body:
        body = render('<tr><td colspan="$n" class="empty">$e</td></tr>', n=len(headers), e=empty)
    return render(
        "<table><thead><tr>$head</tr></thead><tbody>$body</tbody></table>", head=head, body=body
    )


def link(href: str, text: object) -> Safe:
    return render('<a href="$href">$text</a>', href=href, text=text)


def post_button(action: str, label: str, cls: str = "", **fields: object) -> Safe:
    """A one-button form (the server checks that a POST comes from its own pages)."""
    hidden = join(
        render('<input type="hidden" name="$k" value="$v">', k=k, v=v)
        for k, v in fields.items()
        if v not in (None, "")
    )
    return render(
        '<form method="post" action="$action" class="inline">$hidden'
        '<button type="submit" class="$cls">$label</button></form>',
        action=action,
        hidden=hidden,
        cls=cls,
        label=label,
    )


def sparkline(values: Sequence[int], width: int = 120, height: int = 24) -> Safe:
    """An inline SVG polyline of ``values`` (oldest first), scaled to the largest."""
    top = max(values, default=0) or 1
    n = max(len(values) - 1, 1)
    points = " ".join(
        f"{i * width / n:.1f},{height - 1 - v * (height - 2) / top:.1f}"
        for i, v in enumerate(values)
    )
    return render(
        '<svg class="spark" width="$w" height="$h" viewBox="0 0 $w $h" role="img" '
        'aria-label="$label"><polyline fill="none" stroke="currentColor" '
        'stroke-width="1.5" points="$points"/></svg>',
        w=width,
        h=height,
        points=points,
        label=f"succeeded per minute, last {len(values)} minutes, peak {max(values, default=0)}",
    )


STYLE = """
:root { --fg:#1d2327; --muted:#6b7280; --line:#e5e7eb; --bad:#b91c1c; --ok:#15803d;
        --accent:#1d4ed8; font-family: system-ui, sans-serif; color: var(--fg); }
body { margin: 0; }
header { display:flex; gap:1.2rem; align-items:center; padding:.6rem 1rem;
         border-bottom:1px solid var(--line); flex-wrap:wrap; }
header b { font-size:1.1rem; } header a { color:var(--accent); text-decoration:none; }
main { padding: 1rem; overflow-x:auto; }
table { border-collapse: collapse; margin: .5rem 0 1.2rem; font-size:.9rem; }
th, td { text-align:left; padding:.3rem .6rem; border-bottom:1px solid var(--line);
         vertical-align: top; }
td.empty { color: var(--muted); }
pre { margin:0; max-width: 70ch; white-space: pre-wrap; word-break: break-all; }
.state-succeeded { color: var(--ok); } .state-dead, .bad { color: var(--bad); }
.muted, small { color: var(--muted); }
form.inline { display:inline; margin:0; }
form.filters { display:flex; gap:.5rem; flex-wrap:wrap; margin-bottom:.5rem; }
button { cursor:pointer; } .spark { color: var(--accent); vertical-align: middle; }
#refresh { margin-left:auto; font-size:.85rem; }
@media (max-width: 640px) { th, td { padding:.2rem .3rem; } }
"""

#: Auto-refresh: re-fetch this page and swap in its <main>, so scroll position and the
#: page stay put (no full reload); off while the pointer is in a form.
SCRIPT = """
(function () {
  var box = document.getElementById('auto');
  box.checked = localStorage.getItem('deadman-auto') !== 'off';
  box.addEventListener('change', function () {
    localStorage.setItem('deadman-auto', box.checked ? 'on' : 'off');
  });
  setInterval(function () {
    if (!box.checked || document.activeElement.closest('form')) return;
    fetch(location.href, {credentials: 'same-origin'}).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (text) {
      if (!text) return;
      var doc = new DOMParser().parseFromString(text, 'text/html');
      var fresh = doc.querySelector('main');
      if (fresh) document.querySelector('main').replaceWith(fresh);
    }).catch(function () {});
  }, 2000);
})();
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · deadman</title><style>$style</style></head>
<body><header><b>deadman</b>
<a href="/ui/">queues</a><a href="/ui/jobs">jobs</a><a href="/ui/dead">dead letters</a>
<a href="/ui/workers">workers</a>
<label id="refresh"><input type="checkbox" id="auto" checked> auto-refresh</label>
</header>
<main><h1>$title</h1>$body</main>
<script>$script</script></body></html>"""


def page(title: str, body: Safe) -> Safe:
    return render(PAGE, title=title, body=body, style=Safe(STYLE), script=Safe(SCRIPT))


LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sign in · deadman</title><style>$style</style></head>
<body><main><h1>deadman</h1>
<form method="post" action="/ui/login">
<p><label>API token <input type="password" name="token" autocomplete="current-password"
autofocus required></label> <button type="submit">sign in</button></p>
<p class="bad">$error</p>
</form></main></body></html>"""


def login_page(error: str = "") -> Safe:
    return render(LOGIN, style=Safe(STYLE), error=error)
