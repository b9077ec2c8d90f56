"""The settings module of the site's Django snippets (``asgi.py``, ``wsgi.py``) when they run
as pasted: ``DJANGO_SETTINGS_MODULE`` names it, in place of the reader's ``mysite.settings``.
No apps, no database, no URLs."""

SECRET_KEY = "docs-snippets"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = __name__
urlpatterns: list[object] = []
