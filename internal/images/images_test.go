package images

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/content/local"
	"github.com/containerd/containerd/images/archive"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func testSpec() Spec {
	return Spec{
		Files: []File{
			{Path: "/bin/tool", Mode: 0o755, Data: []byte("#!/bin/true\n")},
			{Path: "/bin/alias", Link: "tool"},
			{Path: "/etc/app/config", Data: []byte("x=1\n")},
			{Path: "/tmp", Mode: os.ModeDir | os.ModeSticky | 0o777},
		},
		Entrypoint: []string{"/bin/tool"},
		Cmd:        []string{"--serve"},
		Env:        []string{"PATH=/bin", "MESSAGE=hi"},
		WorkingDir: "/etc/app",
		StopSignal: "SIGINT",
		User:       "65534",
	}
}

func mustBuild(t *testing.T, spec Spec) v1.Image {
	t.Helper()
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBuildIsDeterministic(t *testing.T) {
	a := digest(t, mustBuild(t, testSpec()))
	// The order files are given in must not matter.
	spec := testSpec()
	slices.Reverse(spec.Files)
	if b := digest(t, mustBuild(t, spec)); a != b {
		t.Fatalf("two builds of one spec differ: %s and %s", a, b)
	}
	spec.Env = []string{"PATH=/bin"}
	if c := digest(t, mustBuild(t, spec)); c == a {
		t.Fatal("a different spec built the same digest")
	}
}

func TestBuildConfig(t *testing.T) {
	cf, err := mustBuild(t, testSpec()).ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture == "" || len(cf.RootFS.DiffIDs) != 1 {
		t.Errorf("os/arch/rootfs = %q/%q/%v", cf.OS, cf.Architecture, cf.RootFS.DiffIDs)
	}
	if !slices.Equal(c.Entrypoint, []string{"/bin/tool"}) || !slices.Equal(c.Cmd, []string{"--serve"}) ||
		!slices.Equal(c.Env, []string{"PATH=/bin", "MESSAGE=hi"}) || c.WorkingDir != "/etc/app" ||
		c.StopSignal != "SIGINT" || c.User != "65534" {
		t.Errorf("config = %+v", c)
	}
}

func TestBuildLayer(t *testing.T) {
	layers, err := mustBuild(t, testSpec()).Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type entry struct {
		typ  byte
		mode int64
		link string
		data string
	}
	got := map[string]entry{}
	var order []string
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !hdr.ModTime.Equal(epoch) || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s: time %v, owner %d:%d", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid)
		}
		data, _ := io.ReadAll(tr)
		got[hdr.Name] = entry{hdr.Typeflag, hdr.Mode, hdr.Linkname, string(data)}
		order = append(order, hdr.Name)
	}
	want := map[string]entry{
		"bin/":           {tar.TypeDir, 0o755, "", ""},
		"bin/alias":      {tar.TypeSymlink, 0o777, "tool", ""},
		"bin/tool":       {tar.TypeReg, 0o755, "", "#!/bin/true\n"},
		"etc/":           {tar.TypeDir, 0o755, "", ""},
		"etc/app/":       {tar.TypeDir, 0o755, "", ""},
		"etc/app/config": {tar.TypeReg, 0o644, "", "x=1\n"},
		"tmp/":           {tar.TypeDir, 0o1777, "", ""},
	}
	if len(got) != len(want) {
		t.Errorf("entries = %v", order)
	}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s = %+v, want %+v", n, got[n], w)
		}
	}
	if !slices.IsSorted(order) {
		t.Errorf("entries not sorted: %v", order)
	}
}

func TestBuildRejectsBadFiles(t *testing.T) {
	for _, files := range [][]File{
		{{Path: "relative"}},
		{{Path: "/"}},
		{{Path: "/a"}, {Path: "/a/"}},
		{{Path: "/dev/null", Mode: os.ModeDevice}},
		{{Path: "/a"}, {Path: "/a/b"}},
		{{Path: "/a", Link: "b"}, {Path: "/a/b"}},
	} {
		if _, err := Build(Spec{Files: files}); err == nil {
			t.Errorf("Build(%+v) succeeded", files)
		}
	}
}

func TestPauseImage(t *testing.T) {
	cf, err := mustBuild(t, PauseImage([]byte("bin"))).ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/pause"}) {
		t.Fatalf("entrypoint = %v", cf.Config.Entrypoint)
	}
}

func TestWriteTarball(t *testing.T) {
	img := mustBuild(t, testSpec())
	const ref = "127.0.0.1:5000/skiff/test:v1"
	file := filepath.Join(t.TempDir(), "image.tar")
	if err := WriteTarball(img, ref, file); err != nil {
		t.Fatal(err)
	}

	// go-containerregistry reads it back with the same config and layers.
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatal(err)
	}
	wantCfg, _ := img.ConfigName()
	if gotCfg, err := back.ConfigName(); err != nil || gotCfg != wantCfg {
		t.Fatalf("config digest = %v (%v), want %v", gotCfg, err, wantCfg)
	}

	// containerd's importer (what client.Import runs) names the image ref and keeps its config.
	store, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	idxDesc, err := archive.ImportIndex(ctx, store, f)
	if err != nil {
		t.Fatal(err)
	}
	var idx ocispec.Index
	readJSON(t, ctx, store, idxDesc, &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] != ref {
		t.Fatalf("imported index = %+v", idx.Manifests)
	}
	var m ocispec.Manifest
	readJSON(t, ctx, store, idx.Manifests[0], &m)
	if m.Config.Digest.String() != wantCfg.String() {
		t.Fatalf("imported config = %s, want %s", m.Config.Digest, wantCfg)
	}
	if p := idx.Manifests[0].Platform; p == nil || p.OS != "linux" {
		t.Fatalf("imported platform = %+v", p)
	}
}

func readJSON(t *testing.T, ctx context.Context, store content.Store, desc ocispec.Descriptor, v any) {
	t.Helper()
	b, err := content.ReadBlob(ctx, store, desc)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img := mustBuild(t, testSpec())
	ctx := context.Background()
	ref := host + "/skiff/test:v1"
	if err := Push(ctx, img, ref); err != nil {
		t.Fatal(err)
	}
	// Pushing again, or under another tag, finds the blobs there already.
	if err := Push(ctx, img, host+"/skiff/test:v2"); err != nil {
		t.Fatal(err)
	}

	// Pull the manifest and every blob back, checking their digests.
	manifest := get(t, srv.URL+"/v2/skiff/test/manifests/v1")
	if got, want := sha(manifest), digest(t, img).String(); got != want {
		t.Fatalf("pulled manifest digest %s, pushed %s", got, want)
	}
	m, err := v1.ParseManifest(strings.NewReader(string(manifest)))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range append([]v1.Descriptor{m.Config}, m.Layers...) {
		if blob := get(t, srv.URL+"/v2/skiff/test/blobs/"+d.Digest.String()); sha(blob) != d.Digest.String() {
			t.Fatalf("blob %s came back as %s", d.Digest, sha(blob))
		}
	}
	var cf v1.ConfigFile
	if err := json.Unmarshal(get(t, srv.URL+"/v2/skiff/test/blobs/"+m.Config.Digest.String()), &cf); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/bin/tool"}) {
		t.Fatalf("pulled entrypoint = %v", cf.Config.Entrypoint)
	}

	// A digest reference works too.
	d := digest(t, img)
	if err := Push(ctx, img, host+"/skiff/other@"+d.String()); err != nil {
		t.Fatal(err)
	}
	if err := Push(ctx, img, "127.0.0.1:1/skiff/test:v1"); err == nil {
		t.Fatal("push to a closed port succeeded")
	}
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v %s", url, resp.Status, err, b)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func TestStaticBinary(t *testing.T) {
	// Build from a directory below the module root, as any package's test does.
	out := filepath.Join(t.TempDir(), "pause")
	if err := StaticBinary(context.Background(), "./cmd/skiff-pause", out); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A static binary has no interpreter (PT_INTERP names the dynamic loader).
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary is dynamically linked")
		}
	}
}
