package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"k8s.io/apimachinery/pkg/api/resource"
)

// source remembers the parsed file so that errors found after decoding can point at a line.
type source struct {
	path string
	body *hclsyntax.Body
}

func parseFile(path string, into any) (*source, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	file, diags := hclsyntax.ParseConfig(data, path, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diagErrors(diags, nil)
	}
	body := file.Body.(*hclsyntax.Body)
	src := &source{path: path, body: body}
	if diags := gohcl.DecodeBody(file.Body, nil, into); diags.HasErrors() {
		return nil, diagErrors(diags, body)
	}
	return src, nil
}

// Error is one configuration problem at a place in a file.
type Error struct {
	File string
	Line int
	Key  string // dotted path, e.g. server.raft.election_timeout
	Msg  string
}

func (e Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	switch {
	case loc == "" && e.Key == "":
		return e.Msg
	case loc == "":
		return fmt.Sprintf("%s: %s", e.Key, e.Msg)
	case e.Key == "":
		return fmt.Sprintf("%s: %s", loc, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", loc, e.Key, e.Msg)
}

// Errors collects every problem of a file, so that the operator fixes them in one round.
type Errors []Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

func (es *Errors) add(src *source, key, msg string) {
	e := Error{Key: key, Msg: msg}
	if src != nil {
		e.File = src.path
		if src.body != nil {
			if r, ok := findKey(src.body, strings.Split(key, ".")); ok {
				e.Line = r.Start.Line
			}
		}
	}
	*es = append(*es, e)
}

func (es *Errors) duration(src *source, key, val string) time.Duration {
	d, err := time.ParseDuration(val)
	if err != nil {
		es.add(src, key, fmt.Sprintf("%q is not a duration (use a number with a unit, such as \"500ms\" or \"2s\")", val))
		return 0
	}
	if d <= 0 {
		es.add(src, key, fmt.Sprintf("%q must be positive", val))
	}
	return d
}

// gossipKey checks an `encrypt` key, which servers and agents share: base64 of 16, 24 or 32 bytes.
func (es *Errors) gossipKey(src *source, key, val string) string {
	if b, err := base64.StdEncoding.DecodeString(val); err != nil || (len(b) != 16 && len(b) != 24 && len(b) != 32) {
		es.add(src, key, "must be a base64 key of 16, 24 or 32 bytes (for example from `openssl rand -base64 32`)")
	}
	return val
}

// minMemoryLimit is the least memory_limit taken: an empty server's heap is about 100 MB, and below a
// limit its live heap reaches, the garbage collector runs almost without pause.
const minMemoryLimit = 256 << 20

// memoryLimit parses a memory_limit, a Kubernetes quantity ("2Gi", "1500Mi"), into bytes.
func (es *Errors) memoryLimit(src *source, key, val string) int64 {
	q, err := resource.ParseQuantity(val)
	if err != nil {
		es.add(src, key, fmt.Sprintf("%q is not a quantity of bytes (use a number with a unit, such as \"2Gi\" or \"1500Mi\")", val))
		return 0
	}
	if q.Value() < minMemoryLimit {
		es.add(src, key, fmt.Sprintf("%q is below the least a server runs in, 256Mi", val))
	}
	return q.Value()
}

func (es Errors) err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// findKey returns the range of the attribute (or block) at a dotted path. A key set by flags or defaults
// has no range.
func findKey(body *hclsyntax.Body, path []string) (hcl.Range, bool) {
	if len(path) == 1 {
		if a, ok := body.Attributes[path[0]]; ok {
			return a.SrcRange, true
		}
	}
	for _, b := range body.Blocks {
		if b.Type == path[0] {
			if len(path) == 1 {
				return b.TypeRange, true
			}
			if r, ok := findKey(b.Body, path[1:]); ok {
				return r, true
			}
			// The key is not in the file: point at the block that should hold it.
			return b.TypeRange, true
		}
	}
	return hcl.Range{}, false
}

// keyAt returns the dotted path of the attribute or block containing pos, for errors from the HCL decoder
// whose subject is a value rather than a key.
func keyAt(body *hclsyntax.Body, pos hcl.Pos, prefix string) string {
	for name, a := range body.Attributes {
		if a.SrcRange.ContainsPos(pos) {
			return prefix + name
		}
	}
	for _, b := range body.Blocks {
		if b.Range().ContainsPos(pos) {
			if k := keyAt(b.Body, pos, prefix+b.Type+"."); k != "" {
				return k
			}
			return prefix + b.Type
		}
	}
	return ""
}

func diagErrors(diags hcl.Diagnostics, body *hclsyntax.Body) error {
	var es Errors
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		e := Error{Msg: d.Summary}
		if d.Detail != "" {
			e.Msg += ": " + d.Detail
		}
		if d.Subject != nil {
			e.File, e.Line = d.Subject.Filename, d.Subject.Start.Line
			if body != nil {
				e.Key = keyAt(body, d.Subject.Start, "")
			}
		}
		es = append(es, e)
	}
	if len(es) == 0 {
		return errors.New("invalid configuration")
	}
	return es
}

// mergeFields copies every non-nil pointer, non-empty slice or map and (recursively) block of src over dst. Both are
// pointers to the same struct type.
func mergeFields(dst, src any) {
	dv, sv := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	for i := 0; i < sv.NumField(); i++ {
		sf, df := sv.Field(i), dv.Field(i)
		switch sf.Kind() {
		case reflect.Pointer:
			if sf.IsNil() {
				continue
			}
			if sf.Elem().Kind() == reflect.Struct {
				if df.IsNil() {
					df.Set(reflect.New(sf.Elem().Type()))
				}
				mergeFields(df.Interface(), sf.Interface())
				continue
			}
			df.Set(sf)
		case reflect.Slice, reflect.Map:
			if sf.Len() > 0 {
				df.Set(sf)
			}
		}
	}
}

// layer reads the file at path (if not empty) into a fresh F and layers it over defaults, then flags (which
// may be nil) over that: the one layering every configuration kind goes through.
func layer[F any](path string, defaults, flags *F) (*F, *source, error) {
	src := &source{}
	if path != "" {
		var file F
		var err error
		if src, err = parseFile(path, &file); err != nil {
			return nil, nil, err
		}
		mergeFields(defaults, &file)
	}
	if flags != nil {
		mergeFields(defaults, flags)
	}
	return defaults, src, nil
}
