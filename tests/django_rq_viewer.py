"""django-rq's admin pages, rendered by its own views for a staff user: the viewer the
django-rq integration test (integration/test_integration_django_rq.py) and the registry
tests (recover/test_registries.py) both look through. It lives beside the other helpers,
on the tests' import path, because it is also Django's ``ROOT_URLCONF``, which Django
imports by module name."""

from __future__ import annotations

import re
from typing import Any

from integration_scenarios import QUEUE, require

STATUSES = "queued|started|finished|failed|deferred|scheduled|canceled|stopped"
VIEW_OF = {"queued": "", "started": "started/", "finished": "finished/", "failed": "failed/"}


def configure_django(url: str) -> None:
    """Minimal settings for django-rq's views, once per process (Django allows one)."""
    require("django_rq")
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=True,
            SECRET_KEY="rq-emq-tests",
            ALLOWED_HOSTS=["*"],
            INSTALLED_APPS=[
                "django.contrib.admin",
                "django.contrib.auth",
                "django.contrib.contenttypes",
                "django.contrib.sessions",
                "django.contrib.messages",
                "django_rq",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            TEMPLATES=[
                {
                    "BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True,
                    "OPTIONS": {
                        "context_processors": [
                            "django.template.context_processors.request",
                            "django.contrib.auth.context_processors.auth",
                            "django.contrib.messages.context_processors.messages",
                        ]
                    },
                }
            ],
            ROOT_URLCONF=__name__,
            RQ_QUEUES={QUEUE: {"URL": url}},
            USE_TZ=True,
        )
        django.setup()
    settings.RQ_QUEUES = {QUEUE: {"URL": url}}


def __getattr__(name: str) -> Any:
    # This module is Django's ROOT_URLCONF; its patterns can only be built once Django is set up.
    if name == "urlpatterns":
        from django.contrib import admin
        from django.urls import include, path

        return [path("admin/", admin.site.urls), path("django-rq/", include("django_rq.urls"))]
    raise AttributeError(name)


class DjangoRQViewer:
    """django-rq's admin pages, rendered by its own views for a staff user."""

    def __init__(self, url: str) -> None:
        configure_django(url)
        from django.contrib.auth.models import User
        from django.test import RequestFactory

        self.factory = RequestFactory()
        self.user = User(username="ops", is_active=True, is_staff=True, is_superuser=True)

    def page(self, path: str) -> str:
        from django.urls import resolve

        request = self.factory.get(path)
        request.user = self.user
        match = resolve(path)
        response = match.func(request, *match.args, **match.kwargs)
        assert response.status_code == 200, response.content[:2000]
        return response.content.decode()

    def listed(self, registry: str) -> set[str]:
        self.statistics()  # as the stats page does: RQ's stock registry cleanup first
        html = self.page(f"/django-rq/queues/0/{VIEW_OF[registry]}")
        return set(re.findall(r'href="/django-rq/queues/0/([0-9a-f-]{32,36})/"', html))

    def job_status(self, job_id: str) -> str:
        html = self.page(f"/django-rq/queues/0/{job_id}/")
        found = re.search(rf"Status.*?\b({STATUSES})\b", html, re.S)
        assert found, html[:3000]
        return found.group(1)

    def failure_text(self, job_id: str) -> str:
        """The job's page and, where django-rq shows a Result on a page of its own (4.x),
        that page too."""
        html = self.page(f"/django-rq/queues/0/{job_id}/")
        for result_id in re.findall(rf"/django-rq/queues/0/{job_id}/results/([^/]+)/", html):
            html += self.page(f"/django-rq/queues/0/{job_id}/results/{result_id}/")
        return html

    def statistics(self) -> dict[str, Any]:
        from django_rq.utils import get_statistics

        (queue,) = [q for q in get_statistics(run_maintenance_tasks=True)["queues"] if q["name"] == QUEUE]
        return queue
