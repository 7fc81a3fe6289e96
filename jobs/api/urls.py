from django.urls import path

from . import views

urlpatterns = [
    path("<str:project_id>/training-jobs", views.TrainingJobList.as_view(), name="api-job-list"),
    path("<str:project_id>/training-jobs/<uuid:job_id>", views.TrainingJobDetail.as_view(), name="api-job-detail"),
    path("<str:project_id>/training-jobs/<uuid:job_id>/actions", views.TrainingJobActions.as_view()),
    path("<str:project_id>/training-jobs/<uuid:job_id>/recoveries", views.TrainingJobRecoveries.as_view()),
    path("<str:project_id>/training-jobs/<uuid:job_id>/events", views.TrainingJobEvents.as_view()),
    path("<str:project_id>/training-jobs/<uuid:job_id>/metrics", views.TrainingJobMetrics.as_view()),
    path("<str:project_id>/training-jobs/<uuid:job_id>/tasks/<str:task>/logs", views.TrainingJobTaskLogs.as_view()),
]
