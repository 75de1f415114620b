"""Django admin for agent definitions and the session index."""

import secrets
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from agents_app.models import (
    WEBHOOK_SUBSCRIBABLE_EVENTS,
    AgentDefinition,
    AgentSession,
    AgentSubagent,
    AgentTrigger,
    ApiToken,
    ApprovalDecision,
    ApprovalNotification,
    ApprovalRequest,
    Budget,
    NotificationPreference,
    OutboxMessage,
    OutboxTurnCancel,
    Schedule,
    ScheduleRun,
    TriggerDelivery,
    UsageRecord,
    Webhook,
    WebhookDelivery,
    WebhookEvent,
)
from agents_app.notify.webhooks import webhook_ping
from agents_app.selectors import triggers as trigger_reads
from agents_app.services import schedules as schedule_writes
from agents_app.services import triggers as trigger_services


class ReadOnlyAdminMixin:
    """Lists and shows rows but never adds, changes or deletes them: what these admins show is
    written by the platform (the API, the worker) and audited."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AgentSubagentInline(admin.TabularInline):
    """Subagents (issue 29): the agents this one may call as ``agent__<slug>`` tools."""

    model = AgentSubagent
    fk_name = "parent"
    extra = 0
    fields = ("child", "description", "position")
    autocomplete_fields = ("child",)
    verbose_name = "subagent"
    verbose_name_plural = "subagents (offered to the model as agent__<slug> tools)"


@admin.register(AgentDefinition)
class AgentDefinitionAdmin(admin.ModelAdmin):
    inlines = (AgentSubagentInline,)
    list_display = ("slug", "name", "model", "enabled", "tool_count", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("slug", "name", "model")
    filter_horizontal = ("tools",)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    readonly_fields = ("created_at", "updated_at")
    prepopulated_fields = {"slug": ("name",)}

    @admin.display(description="tools")
    def tool_count(self, obj: AgentDefinition) -> int:
        return obj.tools.count()


@admin.register(AgentSession)
class AgentSessionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: sessions are started through the API, and Dex holds their content.

    Deleting is disabled too: removing the index row would leave its Dex Flow running
    unseen and orphan its approval audit trail. Stop a session with
    ``POST /api/v1/sessions/<id>/stop/`` instead.
    """

    list_display = ("id", "owner", "agent", "title", "status", "created_at")
    list_filter = ("status", "agent")
    list_select_related = ("owner", "agent")
    search_fields = ("id", "title", "owner__username")
    readonly_fields = (
        "id", "owner", "agent", "title", "title_source", "status", "parent",
        "parent_tool_call_id", "created_at", "updated_at",
    )


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only audit trail: decisions are made through the approvals API only."""

    list_display = (
        "decided_at", "session", "tool_name", "approved", "edited", "decided_by", "delivery",
        "interrupt_id",
    )

    @admin.display(boolean=True, description="edited")
    def edited(self, decision: ApprovalDecision) -> bool:
        """Whether staff edited the arguments before approving."""
        return bool(decision.edited_arguments)
    list_filter = ("approved", "delivery", "tool_name")
    list_select_related = ("session", "decided_by")
    search_fields = ("session__id", "interrupt_id", "tool_call_id", "tool_name",
                     "decided_by__username")
    date_hierarchy = "decided_at"
    readonly_fields = (
        "session", "interrupt_id", "tool_call_id", "tool_name", "arguments",
        "edited_arguments", "approved", "rejection_message", "decided_by", "decided_at",
        "delivery", "delivered_at", "attempts", "last_error",
    )


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: the approvals index that the worker keeps and reconciliation repairs."""

    list_display = ("requested_at", "session", "tool_name", "state", "deadline", "closed_at")
    list_filter = ("state", "tool_name")
    list_select_related = ("session",)
    search_fields = ("session__id", "interrupt_id", "tool_name")
    date_hierarchy = "requested_at"
    readonly_fields = (
        "session", "interrupt_id", "tool_call_id", "tool_name", "arguments", "turn_id",
        "requested_at", "deadline", "state", "outcome_message", "closed_at", "updated_at",
    )


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens of every user: list and revoke (delete), nothing else.

    Only digests are stored, so no key can be shown; tokens are created with
    ``POST /api/v1/tokens/`` or ``manage.py createtoken``, which show the key once.
    """

    list_display = ("name", "user", "created", "expiry")
    list_select_related = ("user",)
    list_filter = ("expiry",)
    search_fields = ("name", "user__username")
    fields = ("name", "user", "created", "expiry")
    readonly_fields = ("name", "user", "created", "expiry")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: user messages the API accepted, and whether they reached their session
    (pending ones are delivered by Celery once the engine and a worker answer)."""

    list_display = ("created_at", "session", "delivery", "attempts", "delivered_at", "id")
    list_filter = ("delivery",)
    list_select_related = ("session",)
    search_fields = ("id", "session__id")
    date_hierarchy = "created_at"
    readonly_fields = (
        "id", "session", "text", "plan_mode", "steer", "delivery", "attempts", "last_error",
        "created_at", "delivered_at",
    )


@admin.register(OutboxTurnCancel)
class OutboxTurnCancelAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: turn cancels the API kept while no Dex worker answered, and whether they
    reached their session."""

    list_display = ("requested_at", "session", "turn_id", "delivery", "attempts", "delivered_at")
    list_filter = ("delivery",)
    list_select_related = ("session",)
    search_fields = ("session__id",)
    readonly_fields = (
        "session", "turn_id", "delivery", "attempts", "last_error", "requested_at",
        "delivered_at",
    )


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: one row per model call, written by the worker
    (``agents_app.usage.usage_records``)."""

    list_display = (
        "recorded_at", "owner", "agent", "session", "turn_id", "input_tokens", "output_tokens",
        "cost_usd",
    )
    list_filter = ("day", "agent")
    list_select_related = ("owner", "agent")
    search_fields = ("session__id", "owner__username")
    date_hierarchy = "day"


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    """Spending limits per user or per agent, per UTC day or month
    (``agents_app.usage.budgets``)."""

    list_display = ("__str__", "user", "agent", "period", "limit_usd", "enabled", "updated_at")
    list_filter = ("period", "enabled", "agent")
    list_select_related = ("user", "agent")
    search_fields = ("user__username", "agent__slug", "agent__name")
    autocomplete_fields = ("user",)
    readonly_fields = ("created_at", "updated_at")


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    """Who is emailed about approvals (staff with an email address who opted in); staff set
    their own on ``/settings/notifications/`` or with ``PUT /api/v1/me/notifications/``."""

    list_display = ("user", "email_on_approval", "updated_at")
    list_filter = ("email_on_approval",)
    list_select_related = ("user",)
    search_fields = ("user__username", "user__email")
    autocomplete_fields = ("user",)


@admin.register(ApprovalNotification)
class ApprovalNotificationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: the approval emails, one per approval, person and kind, and whether they
    went out (``agents_app.notify.notifications``)."""

    list_display = ("created_at", "user", "kind", "request", "sent_at", "attempts")
    list_filter = ("kind",)
    list_select_related = ("user", "request")
    search_fields = ("user__username", "request__interrupt_id", "request__session__id")
    readonly_fields = (
        "request", "user", "kind", "created_at", "sent_at", "attempts", "last_error",
    )


class WebhookForm(forms.ModelForm):
    """The events as checkboxes, and a way to replace the secret (it is never shown again)."""

    url = forms.URLField(max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[
            (value, label) for value, label in WebhookEvent.choices
            if value in WEBHOOK_SUBSCRIBABLE_EVENTS
        ],
        widget=forms.CheckboxSelectMultiple,
    )
    rotate_secret = forms.BooleanField(
        required=False,
        help_text="Replace the signing secret with a new one (shown once after saving).",
    )

    class Meta:
        model = Webhook
        fields = ("name", "url", "events", "active")


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """Outgoing webhooks (``agents_app.notify.webhooks``). The signing secret is generated on
    creation (or on **rotate secret**) and shown once, in the message after saving; the
    change page shows only its last characters."""

    form = WebhookForm
    list_display = ("name", "url", "event_list", "active", "secret_hint", "updated_at")
    list_filter = ("active",)
    search_fields = ("name", "url")
    readonly_fields = ("secret_hint", "created_at", "updated_at")
    actions = ("send_test_event",)

    @admin.action(description="Send a test event")
    def send_test_event(self, request: HttpRequest, queryset: QuerySet[Webhook]) -> None:
        """Send each selected active webhook a signed ``ping`` event
        (``webhooks.webhook_ping``), logged in *Webhook deliveries* like every event."""
        sent: list[Webhook] = []
        for webhook in queryset:
            if not webhook.active:
                messages.warning(
                    request, f"No test event for {webhook.name}: the webhook is inactive."
                )
                continue
            webhook_ping(webhook=webhook, sent_by=request.user.get_username())
            sent.append(webhook)
        if sent:
            log = reverse("admin:agents_app_webhookdelivery_changelist")
            messages.success(request, format_html(
                'Test event (<code>ping</code>) queued for {}; its outcome shows in '
                '<a href="{}?event__exact=ping">Webhook deliveries</a>.',
                ", ".join(webhook.name for webhook in sent), log,
            ))

    @admin.display(description="events")
    def event_list(self, webhook: Webhook) -> str:
        return ", ".join(webhook.events)

    def get_deleted_objects(
        self, objs: Any, request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        """What deleting ``objs`` deletes, as ``ModelAdmin.get_deleted_objects``, except that
        a webhook's delivery log goes with it: the log is read-only in admin (no one deletes
        its rows), and Django would otherwise refuse to delete any webhook that has sent an
        event ("your account doesn't have permission to delete ... webhook delivery")."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(str(WebhookDelivery._meta.verbose_name))
        return deleted, counts, perms_needed, protected

    def save_model(self, request: HttpRequest, obj: Webhook, form: Any, change: bool) -> None:
        new_secret = not obj.secret or form.cleaned_data.get("rotate_secret")
        if new_secret:
            obj.secret = "whsec_" + secrets.token_urlsafe(32)
        super().save_model(request, obj, form, change)
        if new_secret:
            messages.warning(
                request,
                f"Signing secret of {obj.name} (copy it now, it is not shown again): "
                f"{obj.secret}",
            )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only delivery log: each event sent (or to send) to each webhook."""

    list_display = (
        "created_at", "webhook", "event", "status", "response_status", "attempts",
        "last_attempt_at",
    )
    list_filter = ("status", "event", "webhook")
    list_select_related = ("webhook",)
    search_fields = ("event_id", "key")
    date_hierarchy = "created_at"
    readonly_fields = (
        "webhook", "event", "event_id", "key", "payload", "status", "response_status",
        "attempts", "last_error", "created_at", "last_attempt_at", "delivered_at",
    )


# Issue 29, "Inbound triggers".


class TriggerDeliveryInline(admin.TabularInline):
    """A trigger's deliveries, newest first, read-only, each linked to its session."""

    model = TriggerDelivery
    extra = 0
    can_delete = False
    max_num = 0
    ordering = ("-received_at", "-id")
    fields = ("received_at", "idempotency_key", "session_link")
    readonly_fields = ("received_at", "idempotency_key", "session_link")
    verbose_name_plural = "deliveries (newest first)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[TriggerDelivery]:
        return super().get_queryset(request).select_related("session")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="session")
    def session_link(self, delivery: TriggerDelivery) -> str:
        if delivery.session is None:
            return "(starting)"
        return format_html(
            '<a href="{}">{}</a> <a href="{}">(admin)</a>',
            reverse("pages:session-detail", args=[delivery.session.pk]),
            delivery.session.title or delivery.session.pk,
            reverse("admin:agents_app_agentsession_change", args=[delivery.session.pk]),
        )


class AgentTriggerForm(forms.ModelForm):
    """A trigger's settings, and a way to replace its secret (it is never shown again)."""

    rotate_secret = forms.BooleanField(
        required=False,
        help_text="Replace the signing secret with a new one (shown once after saving).",
    )

    class Meta:
        model = AgentTrigger
        fields = (
            "agent", "name", "description", "enabled", "run_as", "message_template",
            "signature_style", "idempotency_header", "idempotency_required", "max_body_bytes",
        )
        widgets = {"message_template": forms.Textarea(attrs={"rows": 4, "cols": 80})}


@admin.register(AgentTrigger)
class AgentTriggerAdmin(admin.ModelAdmin):
    """Inbound triggers (``agents_app.api.triggers``): a signed POST to the trigger's URL
    starts a session of its agent. The signing secret is generated on creation (or on
    **rotate secret**, in the form or as an action) and shown once, in the message after
    saving; the change page shows only its last characters. The deliveries are listed
    read-only below, each with its session."""

    form = AgentTriggerForm
    list_display = (
        "name", "agent", "run_as", "signature_style", "enabled", "secret_hint", "trigger_url",
    )
    list_filter = ("enabled", "signature_style", "agent")
    list_select_related = ("agent", "run_as")
    search_fields = ("name", "agent__slug", "run_as__username")
    autocomplete_fields = ("run_as",)
    readonly_fields = ("trigger_url", "secret_hint", "created_at", "updated_at")
    inlines = (TriggerDeliveryInline,)
    actions = ("rotate_secrets",)

    @admin.display(description="URL")
    def trigger_url(self, trigger: AgentTrigger) -> str:
        """The full URL senders POST to (on ``DEXAGENTS_PUBLIC_URL``)."""
        if trigger.pk is None:
            return "(shown once saved)"
        return format_html("<code>{}</code>", trigger_reads.trigger_url(trigger=trigger))

    @admin.action(description="Rotate the signing secret (shown once)")
    def rotate_secrets(self, request: HttpRequest, queryset: QuerySet[AgentTrigger]) -> None:
        for trigger in queryset.select_related("agent"):
            secret = trigger_services.trigger_secret_rotate(trigger=trigger)
            self._secret_show(request, trigger, secret)

    @staticmethod
    def _secret_show(request: HttpRequest, trigger: AgentTrigger, secret: str) -> None:
        messages.warning(
            request,
            f"Signing secret of trigger {trigger} (copy it now, it is not shown again): "
            f"{secret}",
        )

    def get_deleted_objects(
        self, objs: Any, request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        """As ``WebhookAdmin.get_deleted_objects``: the read-only delivery log goes with its
        trigger (the sessions stay)."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(str(TriggerDelivery._meta.verbose_name))
        return deleted, counts, perms_needed, protected

    def save_model(
        self, request: HttpRequest, obj: AgentTrigger, form: Any, change: bool
    ) -> None:
        new_secret = not obj.secret or form.cleaned_data.get("rotate_secret")
        if new_secret:
            obj.secret = trigger_services.trigger_secret_new()
        super().save_model(request, obj, form, change)
        if new_secret:
            self._secret_show(request, obj, obj.secret)


# --- Schedules (issue 29) -------------------------------------------------------------------


class ScheduleRunInline(admin.TabularInline):
    """A schedule's runs, read-only, newest first, each linked to its session."""

    model = ScheduleRun
    extra = 0
    can_delete = False
    ordering = ("-slot",)
    fields = ("slot", "outcome", "session_link", "detail", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="session")
    def session_link(self, run: ScheduleRun) -> str:
        if run.session_id is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:agents_app_agentsession_change", args=[run.session_id]),
            run.session_id,
        )


class ScheduleAdminForm(forms.ModelForm):
    """Checks a schedule as the API does (``services.schedules.schedule_validate``)."""

    class Meta:
        model = Schedule
        fields = (
            "owner", "agent", "name", "message", "cron", "interval_seconds", "timezone",
            "target", "session", "enabled", "missed_run_policy",
        )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        owner = cleaned.get("owner")
        if owner is not None and not self.errors:
            values = {name: cleaned.get(name) for name in schedule_writes.SCHEDULE_FIELDS}
            values["cron"] = str(values.get("cron") or "").strip()
            try:
                schedule_writes.schedule_validate(owner=owner, values=values)
            except schedule_writes.ScheduleValidationError as error:
                for field, field_errors in error.errors.items():
                    self.add_error(field if field in self.fields else None, field_errors)
        return cleaned


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Every user's schedules; the admin picks the owner. Saving goes through
    ``services.schedules`` so the generation moves and the Dex Flow follows."""

    form = ScheduleAdminForm
    list_display = ("name", "owner", "agent", "cron", "interval_seconds", "timezone", "target",
                    "enabled", "missed_run_policy", "updated_at")
    list_filter = ("enabled", "target", "agent")
    search_fields = ("name", "owner__username", "message")
    raw_id_fields = ("session",)
    inlines = (ScheduleRunInline,)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        values = {name: form.cleaned_data.get(name) for name in schedule_writes.SCHEDULE_FIELDS}
        if change:
            saved = schedule_writes.schedule_update(
                schedule=obj, owner=form.cleaned_data["owner"], **values
            )
        else:
            saved = schedule_writes.schedule_create(owner=form.cleaned_data["owner"], **values)
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        schedule_writes.schedule_delete(schedule=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            schedule_writes.schedule_delete(schedule=schedule)
