from django.urls import path

from . import consumers, ssh_relay, terminal

websocket_urlpatterns = [
    path("ws/jobs/", consumers.JobListConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_id>/", consumers.JobConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_id>/logs/<int:index>/", consumers.LogConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_id>/terminal/<int:index>/", terminal.TerminalConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_id>/ssh/<int:index>/", ssh_relay.SshRelayConsumer.as_asgi()),
]
