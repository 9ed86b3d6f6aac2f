from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """Page numbers; a page or page size that is not a positive integer is a 400 (DRF would
    silently use the default size), as the schema's ``minimum`` says."""

    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        return min(_positive(raw, self.page_size_query_param), self.max_page_size)

    def get_page_number(self, request, paginator):
        raw = request.query_params.get(self.page_query_param)
        if raw is None or raw in self.last_page_strings:
            return super().get_page_number(request, paginator)
        _positive(raw, self.page_query_param)
        return raw

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = f"Results per page (at most {self.max_page_size}; more is cut to it)."
        return parameters


def _positive(raw, name):
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValidationError({name: ["must be a positive integer"]})
    return int(raw)
