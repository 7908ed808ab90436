"""The breadcrumbs of the admin's own pages, in the markup of the running Django's admin.

Django changes that markup between versions: 5.2 and 6.0 render
`<div class="breadcrumbs">` with `&rsaquo;` between the links, 6.1 an
`<ol class="breadcrumbs">` of `<li>` items, and each version's CSS styles only
its own. So the pages do not write their breadcrumbs: they render the
`breadcrumbs` block of Django's own `admin/change_form.html` (Home, the app,
the job list, then the page's title where the job would be) or
`admin/change_list.html` (Home, the app, the model's list), as the project's
template engine finds them. A project that overrides those templates (an admin
theme) gets its own breadcrumbs on these pages too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.contrib import admin
from django.db.models.options import Options
from django.http import HttpRequest
from django.template import Engine, RequestContext
from django.template.loader_tags import BlockNode
from django.utils.safestring import SafeString, mark_safe


@dataclasses.dataclass(frozen=True)
class ListTrail:
    """What `admin/change_list.html`'s breadcrumbs read of its change list: `cl.opts`."""

    opts: Options[Any]


def job_page_breadcrumbs(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, title: str
) -> SafeString:
    """Home, the app, the model's list, then `title`, as the model's change form has them.

    The list is a link only for who may view it, as on Django's own pages. Set
    `request.current_app` first: the links go to that admin site.
    """
    values = {
        "opts": model_admin.model._meta,
        "has_view_permission": model_admin.has_view_permission(request),
        "add": False,
        "original": title,
    }
    return render_django_block(request, "admin/change_form.html", values)


def model_list_breadcrumbs(model_admin: admin.ModelAdmin[Any], request: HttpRequest) -> SafeString:
    """Home, the app, then the model's plural name, as the model's change list has them.

    Set `request.current_app` first: the links go to that admin site.
    """
    trail = ListTrail(model_admin.model._meta)
    return render_django_block(request, "admin/change_list.html", {"cl": trail})


def render_django_block(
    request: HttpRequest, template_name: str, values: dict[str, Any]
) -> SafeString:
    """The `breadcrumbs` block of Django's `template_name`, rendered alone with `values`.

    Only the block's own nodes render (not the template it sits in, nor a page's
    override of the block). The request gives `{% url %}` its admin site.
    """
    template = Engine.get_default().get_template(template_name)
    blocks = [
        node
        for node in template.nodelist.get_nodes_by_type(BlockNode)
        if isinstance(node, BlockNode) and node.name == "breadcrumbs"
    ]
    if not blocks:
        raise LookupError(f"{template_name} has no breadcrumbs block to render")
    context = RequestContext(request, values)
    with context.render_context.push_state(template), context.bind_template(template):
        html: str = blocks[0].nodelist.render(context)
    return mark_safe(html)  # noqa: S308 - the output of Django's own template
