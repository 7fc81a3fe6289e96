from django.apps import AppConfig


class FaultToleranceConfig(AppConfig):
    name = "faulttolerance"
    verbose_name = "Fault tolerance"
