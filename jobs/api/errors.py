"""API errors in the ModelArts shape: error_code, error_msg, plus every field."""

from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and "error_code" not in data:
        if "detail" in data and len(data) == 1:
            message = str(data["detail"])
            errors = {}
        else:
            errors = {k: [str(m) for m in (v if isinstance(v, list) else [v])] for k, v in data.items()}
            first_field, first = next(iter(errors.items()))
            message = f"{first_field}: {first[0]}"
        response.data = {"error_code": f"Console.{response.status_code}", "error_msg": message, "errors": errors}
    return response
