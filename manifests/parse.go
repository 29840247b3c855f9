package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const (
	// FieldManager is the field manager of every apply.
	FieldManager = "skiff-manifests"
	// FileLabel marks every object a file applied with the file's key (Key), and FileAnnotation names the file.
	FileLabel      = "skiff.dev/manifest"
	FileAnnotation = "skiff.dev/manifest-file"
	// RecordLabel marks the record ConfigMaps, in RecordNamespace, one per file, named RecordName(file).
	RecordLabel     = "skiff.dev/manifest-record"
	RecordNamespace = "kube-system"
	recordPrefix    = "skiff-manifest-"
)

// IsManifest says whether a file of the folder is applied: .yaml, .yml and .json files, not hidden ones
// (editors' swap and backup files start with a dot).
func IsManifest(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// Key is a file's name as a label value and a DNS name: lowercase letters, digits, '-' and '.', at most 63
// characters, starting and ending with a letter or digit. A name that had to change to fit (or is too long)
// gets a hash of the original, so two files never share a key.
func Key(file string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(file) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	key := strings.Trim(b.String(), "-.")
	if key == file && len(key) <= 63 {
		return key
	}
	sum := sha256.Sum256([]byte(file))
	suffix := hex.EncodeToString(sum[:4])
	if len(key) > 63-len(suffix)-1 {
		key = strings.TrimRight(key[:63-len(suffix)-1], "-.")
	}
	if key == "" {
		return "file-" + suffix
	}
	return key + "-" + suffix
}

// RecordName is the name of a file's record ConfigMap.
func RecordName(file string) string { return recordPrefix + Key(file) }

// Ref names an object a file applied: its group and kind (any version of them), namespace and name.
type Ref struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
}

// GroupKind is the ref's group and kind.
func (r Ref) GroupKind() schema.GroupKind {
	return schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).GroupKind()
}

// id is what two refs of the same object share: the version does not matter.
func (r Ref) id() string {
	gk := r.GroupKind()
	return gk.Kind + "." + gk.Group + "/" + r.Namespace + "/" + r.Name
}

func (r Ref) String() string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// RefOf is the ref of an object as the file has it (namespace as given).
func RefOf(u *unstructured.Unstructured) Ref {
	return Ref{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
}

// Parse reads a file's documents: YAML (several, separated by ---) or JSON; a List's items are its objects.
// Empty documents are skipped. Every object needs apiVersion, kind and metadata.name, and appears once.
// Namespaced objects without a namespace get theirs when they are mapped (Applier), not here.
func Parse(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	seen := map[string]int{}
	for doc := 1; ; doc++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		objs := []*unstructured.Unstructured{u}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("document %d: %w", doc, err)
			}
			objs = objs[:0]
			for i := range list.Items {
				objs = append(objs, &list.Items[i])
			}
		}
		for _, o := range objs {
			if o.GetAPIVersion() == "" || o.GetKind() == "" {
				return nil, fmt.Errorf("document %d: an object without apiVersion or kind", doc)
			}
			if o.GetName() == "" {
				return nil, fmt.Errorf("document %d: %s has no metadata.name (generateName cannot be applied)", doc, o.GetKind())
			}
			id := RefOf(o).id()
			if first, dup := seen[id]; dup {
				return nil, fmt.Errorf("document %d: %s is also in document %d", doc, RefOf(o), first)
			}
			seen[id] = doc
			out = append(out, o)
		}
	}
	// Namespaces and CustomResourceDefinitions first, as what follows may live in them or be of their kind;
	// the rest in the file's order.
	sort.SliceStable(out, func(i, j int) bool { return applyRank(out[i]) < applyRank(out[j]) })
	return out, nil
}

func applyRank(u *unstructured.Unstructured) int {
	gk := u.GroupVersionKind().GroupKind()
	switch {
	case gk == schema.GroupKind{Kind: "Namespace"}:
		return 0
	case gk == schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:
		return 1
	}
	return 2
}

// Label sets the file's label and annotation on an object.
func Label(u *unstructured.Unstructured, file string) {
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[FileLabel] = Key(file)
	u.SetLabels(labels)
	annotations := u.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[FileAnnotation] = file
	u.SetAnnotations(annotations)
}

// Checksum is the hex SHA-256 of a file's content.
func Checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Record is what a file's record ConfigMap holds: the file, the checksum of the content last applied, the
// objects that may exist because of it, and the error of the last attempt ("" when it applied).
type Record struct {
	File     string
	Checksum string
	Objects  []Ref
	Error    string
}

// Data is the record as ConfigMap data.
func (r Record) Data() map[string]string {
	objs, _ := json.Marshal(sortedRefs(r.Objects))
	return map[string]string{"file": r.File, "checksum": r.Checksum, "objects": string(objs), "error": r.Error}
}

// RecordFromData reads a record ConfigMap's data.
func RecordFromData(data map[string]string) (Record, error) {
	r := Record{File: data["file"], Checksum: data["checksum"], Error: data["error"]}
	if r.File == "" {
		return r, fmt.Errorf("no file")
	}
	if s := data["objects"]; s != "" {
		if err := json.Unmarshal([]byte(s), &r.Objects); err != nil {
			return r, fmt.Errorf("objects: %w", err)
		}
	}
	return r, nil
}

func sortedRefs(refs []Ref) []Ref {
	out := append([]Ref{}, refs...)
	sort.Slice(out, func(i, j int) bool { return out[i].id() < out[j].id() })
	if out == nil {
		out = []Ref{}
	}
	return out
}

// Union is a's refs and then b's that a lacks.
func Union(a, b []Ref) []Ref {
	out := append([]Ref{}, a...)
	return append(out, Minus(b, a)...)
}

// Minus is the refs of a that b lacks (by group, kind, namespace and name).
func Minus(a, b []Ref) []Ref {
	in := map[string]bool{}
	for _, r := range b {
		in[r.id()] = true
	}
	var out []Ref
	for _, r := range a {
		if !in[r.id()] {
			out = append(out, r)
			in[r.id()] = true
		}
	}
	return out
}
