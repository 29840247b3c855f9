// Package images builds small single-layer OCI images from in-memory files, with go-containerregistry.
//
// No public registry is reachable where Skiff is built and tested, so the images the node agent runs (the pod
// sandbox's pause image, and the test images) are assembled here from static binaries: Build makes the image,
// WriteTarball saves it as an archive that containerd's Import loads, and Push uploads it to a plain-HTTP
// registry (over the OCI distribution API, without credentials). StaticBinary builds the static Go binaries
// that go into them.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of an image layer. Every file is owned by root (uid and gid 0).
type File struct {
	// Path is the absolute path of the file in the image, such as "/bin/sh".
	Path string
	// Mode holds the permission bits (setuid, setgid and sticky included) and the type: os.ModeDir makes a
	// directory; any other type bit is refused. Zero permissions mean 0644 for a file and 0755 for a directory.
	Mode os.FileMode
	// Data is the content of a regular file.
	Data []byte
	// Link, when non-empty, makes the file a symbolic link to Link; Mode and Data are then ignored.
	Link string
}

// Spec describes an image to build: its files and the runtime defaults recorded in its config.
type Spec struct {
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string // "NAME=value" entries
	WorkingDir string
	StopSignal string // such as "SIGTERM"; empty leaves the runtime's default
	User       string // such as "65534" or "nobody"; empty means root
}

// epoch is the time stamped on every file and on the image config, so that the same Spec always yields the
// same digest whenever and wherever it is built.
var epoch = time.Unix(0, 0).UTC()

// Build returns a single-layer OCI image holding spec's files, for linux on the host's architecture.
//
// The result is deterministic: entries are sorted by path, every time is the Unix epoch, and missing parent
// directories are added (mode 0755), so two builds of the same Spec have the same digest.
func Build(spec Spec) (v1.Image, error) {
	raw, err := layerTar(spec.Files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("images: layer: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "skiff internal/images"},
	})
	if err != nil {
		return nil, fmt.Errorf("images: append layer: %w", err)
	}
	// The config now carries the layer's diff ID; fill in the rest.
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("images: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = spec.Env
	cf.Config.WorkingDir = spec.WorkingDir
	cf.Config.StopSignal = spec.StopSignal
	cf.Config.User = spec.User
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("images: config: %w", err)
	}
	return img, nil
}

// layerTar returns the uncompressed layer tar holding files plus their missing parent directories.
func layerTar(files []File) ([]byte, error) {
	entries := map[string]*tar.Header{}
	data := map[string][]byte{}
	for _, f := range files {
		p, err := cleanPath(f.Path)
		if err != nil {
			return nil, err
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("images: %q appears twice", f.Path)
		}
		hdr, err := header(p, f)
		if err != nil {
			return nil, err
		}
		entries[p] = hdr
		data[p] = f.Data
	}
	for p := range entries {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			parent, ok := entries[dir]
			if !ok {
				entries[dir] = &tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: epoch}
			} else if parent.Typeflag != tar.TypeDir {
				return nil, fmt.Errorf("images: /%s is inside /%s, which is not a directory", p, dir)
			}
		}
	}

	names := make([]string, 0, len(entries))
	for p := range entries {
		names = append(names, p)
	}
	// Sorting by path also puts every directory before its contents, as extractors expect.
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		hdr := entries[p]
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("images: %s: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(data[p]); err != nil {
				return nil, fmt.Errorf("images: %s: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	return buf.Bytes(), nil
}

// cleanPath turns an absolute image path into a tar entry name ("/bin/sh" → "bin/sh").
func cleanPath(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("images: path %q is not absolute", p)
	}
	c := strings.TrimPrefix(path.Clean(p), "/")
	if c == "" {
		return "", fmt.Errorf("images: path %q names the root", p)
	}
	return c, nil
}

// header returns the tar header of f, stored under name.
func header(name string, f File) (*tar.Header, error) {
	hdr := &tar.Header{Name: name, ModTime: epoch}
	perm := int64(f.Mode.Perm())
	// tar keeps the setuid, setgid and sticky bits next to the permissions, as in a Unix mode.
	if f.Mode&os.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if f.Mode&os.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if f.Mode&os.ModeSticky != 0 {
		perm |= 0o1000
	}
	switch {
	case f.Link != "":
		hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
	case f.Mode.IsDir():
		hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, name+"/", perm
		if f.Mode.Perm() == 0 {
			hdr.Mode |= 0o755
		}
	case f.Mode.IsRegular():
		hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeReg, int64(len(f.Data)), perm
		if f.Mode.Perm() == 0 {
			hdr.Mode |= 0o644
		}
	default:
		return nil, fmt.Errorf("images: %s: unsupported file type %v", name, f.Mode.Type())
	}
	return hdr, nil
}

// PauseImage returns the spec of the pod sandbox image: binary (cmd/skiff-pause, built static) at /pause, run
// as the entrypoint.
func PauseImage(binary []byte) Spec {
	return Spec{
		Files:      []File{{Path: "/pause", Mode: 0o755, Data: binary}},
		Entrypoint: []string{"/pause"},
	}
}

// WriteTarball writes img to file as a docker-archive tarball (the `docker save` format) whose
// manifest.json records ref as the image's tag, so that containerd's Import (and `ctr images import`) names the
// imported image ref. containerd normalizes the name: "skiff/pause:1" is imported as
// "docker.io/skiff/pause:1", while a ref that names a registry host is kept as it is.
//
// containerd rewrites the manifest in the Docker schema 2 format on import, so the imported image's manifest
// digest differs from img's; its config and layer digests stay the same.
func WriteTarball(img v1.Image, ref, file string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("images: tag %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("images: write %s: %w", file, err)
	}
	return nil
}

// Push uploads img as ref (such as "127.0.0.1:5000/skiff/pause:test", or a digest reference) to a registry
// reached over plain HTTP, with no credentials.
//
// It speaks the OCI distribution API itself rather than through go-containerregistry's remote package, whose
// credential helpers pull in dependencies (docker/cli) this module does not carry. Blobs the registry already
// has are not uploaded again.
func Push(ctx context.Context, img v1.Image, ref string) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return fmt.Errorf("images: reference %q: %w", ref, err)
	}
	repo := r.Context()
	p := pusher{ctx: ctx, base: repo.Registry.Scheme() + "://" + repo.RegistryStr() + "/v2/" + repo.RepositoryStr()}

	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("images: push %s: %w", ref, err)
	}
	for _, l := range layers {
		digest, err := l.Digest()
		if err != nil {
			return fmt.Errorf("images: push %s: %w", ref, err)
		}
		size, err := l.Size()
		if err != nil {
			return fmt.Errorf("images: push %s: %w", ref, err)
		}
		if err := p.blob(digest, size, l.Compressed); err != nil {
			return fmt.Errorf("images: push %s: layer %s: %w", ref, digest, err)
		}
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("images: push %s: %w", ref, err)
	}
	cfgDigest, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("images: push %s: %w", ref, err)
	}
	if err := p.blob(cfgDigest, int64(len(cfg)), func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(cfg)), nil
	}); err != nil {
		return fmt.Errorf("images: push %s: config: %w", ref, err)
	}

	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("images: push %s: %w", ref, err)
	}
	mediaType, err := img.MediaType()
	if err != nil {
		return fmt.Errorf("images: push %s: %w", ref, err)
	}
	// The manifest goes last: a registry may refuse a manifest whose blobs it does not have yet.
	if _, err := p.do(http.MethodPut, p.base+"/manifests/"+r.Identifier(), string(mediaType), bytes.NewReader(manifest),
		int64(len(manifest)), http.StatusCreated); err != nil {
		return fmt.Errorf("images: push %s: manifest: %w", ref, err)
	}
	return nil
}

// pusher uploads to one repository, whose API URL is base (such as "http://127.0.0.1:5000/v2/skiff/pause").
type pusher struct {
	ctx  context.Context
	base string
}

// blob uploads the blob digest, whose content open returns, unless the registry already has it.
func (p pusher) blob(digest v1.Hash, size int64, open func() (io.ReadCloser, error)) error {
	if _, err := p.do(http.MethodHead, p.base+"/blobs/"+digest.String(), "", nil, 0, http.StatusOK); err == nil {
		return nil
	}
	// A monolithic upload: POST opens the upload session, one PUT to its Location sends the content and
	// commits it.
	resp, err := p.do(http.MethodPost, p.base+"/blobs/uploads/", "", nil, 0, http.StatusAccepted)
	if err != nil {
		return err
	}
	loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return fmt.Errorf("upload session without a usable Location %q", resp.Header.Get("Location"))
	}
	q := loc.Query()
	q.Set("digest", digest.String())
	loc.RawQuery = q.Encode()
	body, err := open()
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = p.do(http.MethodPut, loc.String(), "application/octet-stream", body, size, http.StatusCreated)
	return err
}

// do sends one request and fails unless the response has the status want. It drains and closes the body, so
// only the headers of the returned response are of use.
func (p pusher) do(method, url, contentType string, body io.Reader, size int64, want int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(p.ctx, method, url, body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = size
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != want {
		return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(msg))
	}
	return resp, nil
}

// modulePath is the module StaticBinary builds from; it tells this module's go.mod from any other one above
// the working directory.
const modulePath = "github.com/skiff-dev/skiff"

// StaticBinary builds pkg, a package path of this module relative to its root (such as "./cmd/skiff-pause"),
// into the file out as a static, stripped linux binary: CGO_ENABLED=0, -trimpath, -ldflags "-s -w".
//
// It finds the module root by walking up from the working directory, so it works from any package's tests as
// well as from the Makefile. The go command is looked up in PATH (`go test` puts its own there).
func StaticBinary(ctx context.Context, pkg, out string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	// out is relative to the caller's working directory, but the build runs in the module root.
	out, err = filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("images: no go command: %w", err)
	}
	// -buildvcs=false keeps the binary (hence image digests) independent of the git state of the tree.
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("images: go build %s: %w\n%s", pkg, err, output)
	}
	return nil
}

// moduleRoot returns the directory holding this module's go.mod, the nearest one at or above the working
// directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	for {
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declaresModule(gomod, modulePath) {
			return dir, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("images: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("images: no go.mod of module %s at or above the working directory", modulePath)
		}
		dir = parent
	}
}

// declaresModule reports whether the go.mod content gomod declares the module mod.
func declaresModule(gomod []byte, mod string) bool {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == mod {
			return true
		}
	}
	return false
}

// BusyboxPath is the static busybox of Debian's busybox-static package.
const BusyboxPath = "/bin/busybox"

// BusyboxPATH is the PATH of the busybox image.
const BusyboxPATH = "PATH=/bin:/usr/bin:/sbin:/usr/sbin"

// Busybox is the spec of a busybox image made from a static busybox binary: busybox with a link in /bin for
// each of its applets, /tmp, /root and a minimal /etc, and `sh` as its command. The test images and
// `skiff dev` (which offers it to newcomers, who may have no registry) use it.
func Busybox(binary string) (Spec, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return Spec{}, fmt.Errorf("%s is needed for the busybox image (Debian package busybox-static, which setup "+
			"installs): %w", binary, err)
	}
	list, err := exec.Command(binary, "--list").Output()
	if err != nil {
		return Spec{}, fmt.Errorf("%s --list: %w", binary, err)
	}
	files := []File{
		{Path: "/bin/busybox", Mode: 0o755, Data: bin},
		{Path: "/tmp", Mode: os.ModeDir | os.ModeSticky | 0o777},
		{Path: "/root", Mode: os.ModeDir | 0o700},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
			"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	// Every applet goes in /bin (first in PATH); busybox picks the applet from the name it is run by.
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		files = append(files, File{Path: "/bin/" + applet, Link: "busybox"})
	}
	return Spec{Files: files, Env: []string{BusyboxPATH}, Cmd: []string{"sh"}}, nil
}

// OfflineBusyboxRef is the busybox image that `skiff dev` and `skiff local` give their nodes, so that pods
// run on a machine with no registry at hand.
const OfflineBusyboxRef = "skiff.local/busybox:1"

// WriteOfflineBusybox writes the busybox image, made from the host's busybox-static, as a tarball at path;
// an agent imports the tarballs in its <data_dir>/images at start.
func WriteOfflineBusybox(path string) error {
	spec, err := Busybox(BusyboxPath)
	if err != nil {
		return err
	}
	img, err := Build(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return WriteTarball(img, OfflineBusyboxRef, path)
}
