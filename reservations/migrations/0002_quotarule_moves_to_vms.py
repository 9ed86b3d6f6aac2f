"""QuotaRule moves to the VM app (``provisioning``), so one quota engine below reservations
limits reservations and ad-hoc VMs alike. State only: the table ``reservations_quotarule`` and
its rows stay; ``vms.0004`` takes the model over."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("reservations", "0001_initial")]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="QuotaRule")]),
    ]
