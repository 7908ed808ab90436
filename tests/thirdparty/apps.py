from django.apps import AppConfig


class ThirdPartyConfig(AppConfig):
    name = "tests.thirdparty"
    label = "thirdparty"
