from django.urls import path

from .views import account, apps, create, detail
from .views import list as list_views
from .views import storage_browser as storage_views
from .views import terminal as terminal_views

urlpatterns = [
    path("", list_views.job_list, name="job-list"),
    path("jobs/create/", create.job_create, name="job-create"),
    path("jobs/create/validate/", create.job_create_validate, name="job-create-validate"),
    path("jobs/create/what-happens/", create.job_create_whatif, name="job-create-whatif"),
    path("jobs/<uuid:job_id>/", detail.job_detail, name="job-detail"),
    path("jobs/<uuid:job_id>/stop/", detail.job_stop, name="job-stop"),
    path("jobs/<uuid:job_id>/logs/<int:index>/download/", detail.job_log_download, name="job-log-download"),
    path("jobs/<uuid:job_id>/terminal/<int:index>/", terminal_views.job_terminal, name="job-terminal"),
    path("jobs/<uuid:job_id>/apps/<str:app>/<int:index>/", apps.open_app, name="job-app"),
    path("storage/", storage_views.storage_browser, name="storage-browser"),
    path("storage/save/", storage_views.storage_save, name="storage-save"),
    path("account/token/", account.api_token, name="api-token"),
    path("healthz", detail.healthz),
]
