package manifests

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestIsManifest(t *testing.T) {
	for name, want := range map[string]bool{
		"web.yaml": true, "web.YML": true, "crd.json": true, "notes.txt": false, ".web.yaml.swp": false,
		".hidden.yaml": false, "web.yaml~": false, "web.yaml.skip": false,
	} {
		if got := IsManifest(name); got != want {
			t.Errorf("IsManifest(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestKey(t *testing.T) {
	cases := []struct {
		file string
		want string // exact, or a prefix when hashed
		hash bool
	}{
		{"web.yaml", "web.yaml", false},
		{"coredns-1.json", "coredns-1.json", false},
		{"Web.yaml", "web.yaml-", true},
		{"my app.yaml", "my-app.yaml-", true},
		{"_x.yaml", "x.yaml-", true},
		{"___.yaml", "yaml-", true},
		{strings.Repeat("a", 80) + ".yaml", strings.Repeat("a", 54) + "-", true},
	}
	seen := map[string]string{}
	for _, tc := range cases {
		k := Key(tc.file)
		if len(k) > 63 || k[0] == '-' || k[0] == '.' || k[len(k)-1] == '-' || k[len(k)-1] == '.' {
			t.Errorf("Key(%q) = %q: not a label value", tc.file, k)
		}
		if !tc.hash && k != tc.want || tc.hash && (!strings.HasPrefix(k, tc.want) || len(k) != len(tc.want)+8) {
			t.Errorf("Key(%q) = %q, want %q%s", tc.file, k, tc.want, map[bool]string{true: "<hash>"}[tc.hash])
		}
		if other, dup := seen[k]; dup {
			t.Errorf("%q and %q share the key %q", tc.file, other, k)
		}
		seen[k] = tc.file
		if Key(tc.file) != k {
			t.Errorf("Key(%q) is not stable", tc.file)
		}
	}
	if Key("Web.yaml") == Key("web.yaml") {
		t.Error("files differing in case share a key")
	}
	if got := RecordName("web.yaml"); got != "skiff-manifest-web.yaml" {
		t.Errorf("RecordName = %q", got)
	}
}

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		data    string
		want    []string // Kind namespace/name, in apply order
		wantErr string
	}{
		{"multi-document YAML, namespaces and CRDs first", `
apiVersion: v1
kind: ConfigMap
metadata: {name: a, namespace: apps}
---
# a comment only
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: crontabs.example.com}
---
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: b}
`, []string{"Namespace apps", "CustomResourceDefinition crontabs.example.com", "ConfigMap apps/a", "ConfigMap b"}, ""},
		{"JSON", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"j","namespace":"x"}}`, []string{"ConfigMap x/j"}, ""},
		{"a List", `
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: one}}
- {apiVersion: v1, kind: Secret, metadata: {name: two}}
`, []string{"ConfigMap one", "Secret two"}, ""},
		{"empty", "\n---\n", nil, ""},
		{"bad YAML", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a\n", nil, "document 1"},
		{"bad YAML in a later document", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nkind: [\n", nil, "document 2"},
		{"no kind", "apiVersion: v1\nmetadata: {name: a}\n", nil, "without apiVersion or kind"},
		{"no name", "apiVersion: v1\nkind: ConfigMap\nmetadata: {generateName: a-}\n", nil, "no metadata.name"},
		{"twice", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n", nil, "also in document 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Parse([]byte(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range objs {
				got = append(got, RefOf(o).String())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("parsed %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLabel(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "a", "labels": map[string]any{"app": "web"}}}}
	Label(u, "My App.yaml")
	if l := u.GetLabels(); l["app"] != "web" || l[FileLabel] != Key("My App.yaml") {
		t.Fatalf("labels %v", l)
	}
	if a := u.GetAnnotations(); a[FileAnnotation] != "My App.yaml" {
		t.Fatalf("annotations %v", a)
	}
}

func TestRefSets(t *testing.T) {
	cm := func(ns, name string) Ref { return Ref{APIVersion: "v1", Kind: "ConfigMap", Namespace: ns, Name: name} }
	dep := func(version, name string) Ref {
		return Ref{APIVersion: "apps/" + version, Kind: "Deployment", Namespace: "default", Name: name}
	}
	old := []Ref{cm("default", "a"), cm("default", "b"), dep("v1", "web")}
	now := []Ref{cm("default", "a"), cm("other", "b"), dep("v1beta2", "web"), cm("default", "c")}
	// b moved namespace: the old one goes. The Deployment changed only its version: the same object.
	if got := Minus(old, now); len(got) != 1 || got[0] != cm("default", "b") {
		t.Fatalf("Minus = %v", got)
	}
	if got := Union(old, now); len(got) != 5 {
		t.Fatalf("Union = %v", got)
	}
	if got := Minus(nil, now); got != nil {
		t.Fatalf("Minus(nil) = %v", got)
	}
	// A record survives its ConfigMap form.
	rec := Record{File: "web.yaml", Checksum: "abc", Objects: now, Error: "x"}
	back, err := RecordFromData(rec.Data())
	if err != nil || back.File != rec.File || back.Checksum != "abc" || back.Error != "x" || len(Minus(now, back.Objects)) != 0 || len(back.Objects) != len(now) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if _, err := RecordFromData(map[string]string{"file": "a.yaml", "objects": "{"}); err == nil {
		t.Fatal("a bad objects list was read")
	}
	if got := (Record{File: "e.yaml"}).Data()["objects"]; got != "[]" {
		t.Fatalf("empty objects = %q", got)
	}
}
