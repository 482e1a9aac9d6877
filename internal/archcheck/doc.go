// Package archcheck holds the code to the shape docs/architecture.md gives
// it: the package table's "may import" column (ParseTable, CheckImports)
// and the size limits on types, functions and files (MeasureShape). It
// reads the page and the sources as text; it imports nothing of ours.
package archcheck
