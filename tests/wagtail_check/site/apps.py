from django.apps import AppConfig


class SiteConfig(AppConfig):
    name = "tests.wagtail_check.site"
    label = "wagtail_check_site"
    default_auto_field = "django.db.models.AutoField"
