# File systems belong to the workspaces an operator grants them to (docs/decisions.md
# "Workspaces own their storage"). Before this, every workspace could mount every file system:
# existing rows are granted to every existing workspace, so that nothing that ran stops running;
# an operator narrows the grants in the admin.

from django.db import migrations, models


def grant_existing_to_every_workspace(apps, schema_editor):
    FileSystem = apps.get_model("jobs", "FileSystem")
    Workspace = apps.get_model("jobs", "Workspace")
    workspaces = list(Workspace.objects.all())
    for fs in FileSystem.objects.all():
        fs.workspaces.add(*workspaces)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0014_buckets"),
    ]

    operations = [
        migrations.AddField(
            model_name="filesystem",
            name="workspaces",
            field=models.ManyToManyField(
                blank=True,
                help_text="The workspaces whose jobs may mount it (and keep TensorBoard summaries on it); none: no job.",
                related_name="file_systems",
                to="jobs.workspace",
            ),
        ),
        migrations.RunPython(grant_existing_to_every_workspace, migrations.RunPython.noop),
    ]
