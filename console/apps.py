from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from . import language  # noqa: F401  (connects the login signal that restores a user's language)
