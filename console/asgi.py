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

from jobs.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
