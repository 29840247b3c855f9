// Package config reads Skiff's HCL configuration files. It owns the schema, the defaults, the layering
// (defaults, then file, then flags, through one layering function) and validation. Every error names the file, the line
// and the key. Unknown keys are errors, never ignored. It imports no other Skiff package.
package config
