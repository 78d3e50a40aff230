"""The HTML a received run folder carries, made safe to show in report.html.

A run folder can come from anyone (a bug report, a colleague's share), and its executed notebooks
hold HTML of their own: Markdown cells (which may contain raw HTML), ``text/html`` outputs, raw
cells. nbconvert renders them as they are unless it sanitises, and its own sanitiser (bleach, with
no style allowed) drops the colours of every verdict. This one is an allow-list through nh3
(Ammonia): the tags and attributes sparkbook's own outputs use, the few style properties they set,
links only to ``http(s)``, ``mailto`` or within the page, images only from data the notebook
carries itself. No script, event handler, form, frame or style sheet survives, and nothing in the
page fetches from the network when it opens.
"""

import nh3

TAGS = nh3.ALLOWED_TAGS | {"progress", "tfoot"}

# on every tag: what sparkbook's tables, the highlighted code and JupyterLab's output areas use
EVERYWHERE = {"class", "style", "title", "id", "align", "colspan", "rowspan", "dir", "lang"}
ATTRIBUTES = {tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()} | {
    "*": EVERYWHERE, "a": {"href", "name"}, "img": {"src", "alt", "width", "height"},
    "progress": {"value", "max"}}

# no property that takes a url(): a received page must not fetch anything when it opens
STYLES = {"color", "background-color", "text-align", "vertical-align", "white-space", "padding",
          "padding-left", "padding-right", "margin", "border-radius", "border-left", "font-weight",
          "font-style", "font-family", "font-size", "text-decoration", "width", "display"}


def _attribute(tag: str, name: str, value: str) -> str | None:
    """An image only from data the notebook carries; a data URL nowhere else (a link to one
    would open a page of the received notebook's making)."""
    url = value.lstrip().lower()
    if tag == "img" and name == "src":
        return value if url.startswith("data:image/") else None
    return None if name in ("href", "cite") and url.startswith("data:") else value


def clean(fragment) -> str:
    """``fragment`` with only what the allow-list keeps (nbconvert's ``clean_html`` filter's place:
    it is handed strings and, for SVG, bytes)."""
    if isinstance(fragment, bytes):
        fragment = fragment.decode("utf-8", "replace")
    return nh3.clean(str(fragment), tags=TAGS, attributes=ATTRIBUTES, attribute_filter=_attribute,
                     url_schemes={"http", "https", "mailto", "data"}, filter_style_properties=STYLES,
                     clean_content_tags={"script", "style"}, link_rel="noopener noreferrer")
