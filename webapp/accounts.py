"""Sign-in with a rate limit, on every sign-in form (the site's and the admin's): attempts are
counted per client address and per username tried (``ratelimits.check_login_rate``); a browser that
signed in before keeps a signed device cookie, so others' wrong guesses cannot lock it out."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from webapp.snapshots.errors import LimitExceeded
from webapp.snapshots.intake.ratelimits import DEVICE_COOKIE, check_login_rate, device_cookie_value

DEVICE_COOKIE_AGE = 365 * 24 * 3600


def _headers(err: LimitExceeded) -> dict[str, str]:
    return {"X-Error-Code": err.code, "Retry-After": str(err.retry_after or 60)}


def _remember_device(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """After a successful sign-in: the signed note that this browser is the user's (see ratelimits)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        response.set_cookie(
            DEVICE_COOKIE,
            device_cookie_value(user.get_username()),
            max_age=DEVICE_COOKIE_AGE,
            httponly=True,
            samesite="Lax",
            secure=bool(getattr(settings, "SESSION_COOKIE_SECURE", False)),
        )
    return response


class LoginView(auth_views.LoginView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            check_login_rate(request)
        except LimitExceeded as err:
            headers = _headers(err)
            if "application/json" in request.headers.get("Accept", ""):
                return JsonResponse(err.as_json(), status=err.status, headers=headers)
            form = self.get_form()
            form.errors.clear()  # the password is not checked at all while limited
            form.add_error(None, err.message)
            response = self.render_to_response(self.get_context_data(form=form), status=err.status)
            for name, value in headers.items():
                response[name] = value
            return response
        return _remember_device(request, super().post(request, *args, **kwargs))


@never_cache
def admin_login(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    """``/admin/login/`` under the same limits (it had none: 30 wrong passwords, then the right one
    signed in, issue 22); a limited attempt is refused before its password is checked."""
    if request.method == "POST":
        try:
            check_login_rate(request)
        except LimitExceeded as err:
            return HttpResponse(err.message, status=err.status, headers=_headers(err), content_type="text/plain")
        return _remember_device(request, admin.site.login(request, extra_context))
    return admin.site.login(request, extra_context)
