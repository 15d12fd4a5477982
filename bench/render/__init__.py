"""Documents from results: the document model (markdown and HTML), the scaling charts, and the report."""
