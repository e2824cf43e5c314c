"""Sign-in with a rate limit: attempts are counted per client address and per username tried."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, JsonResponse

from webapp.snapshots.limits import LimitExceeded, check_login_rate


class LoginView(auth_views.LoginView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            check_login_rate(request)
        except LimitExceeded as err:
            headers = {"X-Error-Code": err.code, "Retry-After": str(err.retry_after or 60)}
            if "application/json" in request.headers.get("Accept", ""):
                return JsonResponse(err.as_json(), status=err.status, headers=headers)
            form = self.get_form()
            form.errors.clear()  # the password is not checked at all while limited
            form.add_error(None, err.message)
            response = self.render_to_response(self.get_context_data(form=form), status=err.status)
            for name, value in headers.items():
                response[name] = value
            return response
        return super().post(request, *args, **kwargs)
