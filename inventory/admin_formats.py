"""``inventory.formats`` as django-import-export formats, so the admin's import and export read
and write files exactly as the API and the CLI do. Apart from ``formats``: import-export's
formats module loads openpyxl (and numpy) when imported, which only the admin needs."""

from import_export.formats.base_formats import Format

from inventory import formats


class _InventoryFormat(Format):
    """Always reads bytes, so our loader (not the admin) decides about encodings."""

    name = None

    def __init__(self, encoding=None):
        self.encoding = encoding

    def get_title(self):
        return self.name

    def create_dataset(self, in_stream, **kwargs):
        data = in_stream.encode() if isinstance(in_stream, str) else in_stream
        return formats.load(data, self.name)

    def export_data(self, dataset, **kwargs):
        return formats.dump(dataset, self.name)

    def is_binary(self):
        return True

    def get_read_mode(self):
        return "rb"

    def get_extension(self):
        return self.name

    def get_content_type(self):
        return formats.CONTENT_TYPES[self.name]

    def can_import(self):
        return True

    def can_export(self):
        return True


class CSVFormat(_InventoryFormat):
    name = "csv"


class XLSXFormat(_InventoryFormat):
    name = "xlsx"


class JSONFormat(_InventoryFormat):
    name = "json"


class YAMLFormat(_InventoryFormat):
    name = "yaml"


ADMIN_FORMATS = [CSVFormat, XLSXFormat, JSONFormat, YAMLFormat]
