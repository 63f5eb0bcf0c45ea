"""The docs site's generated pages (MkDocs hooks, named in mkdocs.yml): the CLI reference from the argument parser,
the HTTP API from the app's OpenAPI document, and field tables of the pydantic models (configs, settings,
manifests), so the reference pages are built from the code and cannot drift from it."""
