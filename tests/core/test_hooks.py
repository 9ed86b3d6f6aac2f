"""``core.hooks.Hook``: the one way a lower layer is extended, and the site's start-up filling it."""

import pytest

from core import hooks
from core.hooks import Hook


@pytest.fixture
def make_hook():
    """Hooks of this test only: out of ``hooks.HOOKS`` again afterwards."""
    made = []

    def make(**shape):
        made.append(Hook(f"test.hook{len(made)}", **shape))
        return made[-1]

    yield make
    for hook in made:
        hooks.HOOKS.remove(hook)


def one(*args):
    return "one"


def two(*args):
    return "two"


def test_a_callable_registered_twice_is_kept_once(make_hook):
    # AppConfig.ready() may run more than once: its registrations must not pile up.
    hook = make_hook()
    assert not hook and list(hook) == []
    hook.register(one)
    hook.register(two)
    hook.register(one)
    assert list(hook) == [one, two] and hook


def test_a_keyed_hook_keeps_each_keys_registrations_in_order(make_hook):
    hook = make_hook(keyed=True)
    hook.register("vm.create", one)
    hook.register("vm.create", two)
    hook.register("vm.create", one)
    hook.register("vm.destroy", two)
    assert hook.for_key("vm.create") == (one, two)
    assert hook.for_key("vm.destroy") == (two,) and hook.for_key("nothing") == ()
    assert list(hook.items()) == [("vm.create", one), ("vm.create", two), ("vm.destroy", two)]


def test_a_slot_holds_one_callable_and_refuses_another(make_hook):
    slot = make_hook(single=True)
    assert slot.one() is None
    slot.register(one)
    slot.register(one)
    assert slot.one() is one
    with pytest.raises(ValueError, match=r"test.hook0 holds <function one .*> already"):
        slot.register(two)
    assert slot.one() is one


def test_a_keyed_slot_holds_one_per_key(make_hook):
    table = make_hook(keyed=True, single=True)
    table.register("job", one)
    table.register("vm", two)
    assert (table.one("job"), table.one("vm"), table.one("run")) == (one, two, None)
    with pytest.raises(ValueError, match=r"\['job'\] holds"):
        table.register("job", two)


def test_replaced_swaps_the_registrations_for_a_block_only(make_hook):
    hook, table = make_hook(), make_hook(keyed=True)
    hook.register(one)
    table.register("a", one)
    seen = table.by_key  # a reader holding the table (the event outbox does) sees the swap
    with hook.replaced(two), table.replaced(("b", two)):
        assert list(hook) == [two] and seen == {"b": (two,)}
    with hook.replaced():
        assert not hook
    assert list(hook) == [one] and seen == {"a": (one,)}


def test_every_hook_the_project_declares_is_filled_at_start_up():
    # The site installs every app, so a hook still empty after Django's start-up is either dead
    # or an app forgot to register in its ready() (the role and token checks would then refuse
    # everyone, quietly).
    declared = {hook.name: hook for hook in hooks.HOOKS if not hook.name.startswith("test.")}
    assert {"core.topics.ROLE_CHECK", "core.consumers.TOKEN_CHECK", "capacity.services.IMAGE_TYPES"} <= set(declared)
    assert [name for name, hook in declared.items() if not hook] == []


def test_the_slots_are_filled_by_the_apps_above():
    from accounts import access, tokens
    from capacity import services as capacity
    from core import consumers, topics
    from provisioning import services as provisioning

    assert topics.ROLE_CHECK.one() is access.can
    assert consumers.TOKEN_CHECK.one() is tokens.is_live
    assert capacity.IMAGE_TYPES.one() is provisioning.image_types
