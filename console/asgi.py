import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from console.realtime import check_layer_timeouts  # noqa: E402

# Production mode: a Redis socket timeout not above channels-redis's blocking receive closes
# every websocket that waits ~5 s for its next message (1011); refuse to start instead.
check_layer_timeouts()

from jobs import proxy  # noqa: E402
from jobs.routing import websocket_urlpatterns  # noqa: E402

console_application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


async def application(scope, receive, send):
    """The console, and the app origins of running instances (JupyterLab, TensorBoard: jobs/proxy/),
    told apart by the Host header before anything of the console's handling runs."""
    if proxy.is_app_host(scope):
        return await proxy.application(scope, receive, send)
    return await console_application(scope, receive, send)
