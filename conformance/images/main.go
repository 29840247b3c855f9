// Command images builds, on this machine, every container image the Kubernetes conformance suite runs, under
// the names the suite asks for (k8s.io/kubernetes/test/utils/image), and writes each as an image tarball that
// Skiff's agents import at start (`skiff local up --images DIR`): no registry is reachable here, and the
// suite's images are not vendored anywhere.
//
// The images are not the upstream ones, byte for byte; they hold what the suite uses of them:
//   - agnhost (both versions the suite names), kitten and nautilus: the agnhost binary built from the
//     k8s.io/kubernetes module at /agnhost (with the agnhost-2 link), over Alpine Linux as upstream's (Alpine's
//     official minirootfs, which conformance/run.sh fetches) plus the host's dig, nslookup, host, curl,
//     OpenBSD nc and glibc's getent with their shared libraries beside musl (and an nsswitch.conf that reads
//     /etc/hosts first, as musl does); kitten and nautilus add their web pages and run `agnhost
//     test-webserver`. The ImageVolume test mounts kitten and reads its /etc/os-release.
//   - busybox: busybox 1.37.0 (built by conformance/run.sh from the release's source with its defconfig, as
//     upstream's image is) with a link for each applet.
//   - glibc-dns-testing: the base with dig, nslookup, host and getent, for the DNS tests' queriers.
//   - nginx (both versions): the host's nginx (Debian's nginx-light) serving its default page on port 80.
//   - nonroot: the base, run as user 1234.
//   - nonewprivs: the base with k8s.io/kubernetes' test/images/nonewprivs program at /usr/local/bin/nnp,
//     setuid root as upstream's, printing its effective uid (the allowPrivilegeEscalation tests).
//   - pause: Skiff's own pause process.
//   - sample-apiserver: k8s.io/sample-apiserver, built from its module; etcd: the host's etcd at
//     /usr/local/bin/etcd, for the aggregator test.
//
// The binaries that go into them come from the command line (the Makefile builds them).
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	imageutils "k8s.io/kubernetes/test/utils/image"

	"github.com/skiff-dev/skiff/internal/images"
)

func main() {
	out := flag.String("out", "", "directory to write the image tarballs to")
	agnhost := flag.String("agnhost", "", "the agnhost binary (k8s.io/kubernetes/test/images/agnhost, static)")
	sampleAPIServer := flag.String("sample-apiserver", "", "the sample-apiserver binary (k8s.io/sample-apiserver, static)")
	pause := flag.String("pause", "", "Skiff's pause binary (cmd/skiff-pause, static)")
	nnp := flag.String("nonewprivs", "", "the nonewprivs program (k8s.io/kubernetes/test/images/nonewprivs, static)")
	testImages := flag.String("test-images", "", "k8s.io/kubernetes' test/images directory, for the kitten and nautilus pages")
	busybox := flag.String("busybox", "", "a static busybox binary, whose applets are the images' base")
	alpine := flag.String("alpine", "", "an Alpine Linux minirootfs (.tar.gz), agnhost's base")
	flag.Parse()
	if *out == "" || *agnhost == "" || *sampleAPIServer == "" || *pause == "" || *nnp == "" || *testImages == "" || *busybox == "" || *alpine == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	b := &builder{busyboxPath: *busybox, alpinePath: *alpine}
	specs := []struct {
		images []imageutils.ImageID
		spec   func() images.Spec
	}{
		{[]imageutils.ImageID{imageutils.Agnhost, imageutils.AgnhostPrev}, func() images.Spec { return b.agnhost(*agnhost, *testImages, nil, nil) }},
		{[]imageutils.ImageID{imageutils.Kitten}, func() images.Spec { return b.webPages(*agnhost, *testImages, "kitten") }},
		{[]imageutils.ImageID{imageutils.Nautilus}, func() images.Spec { return b.webPages(*agnhost, *testImages, "nautilus") }},
		{[]imageutils.ImageID{imageutils.BusyBox}, func() images.Spec { return b.base() }},
		{[]imageutils.ImageID{imageutils.GlibcDnsTesting}, func() images.Spec {
			return b.base("/usr/bin/dig", "/usr/bin/nslookup", "/usr/bin/host", "/usr/bin/getent")
		}},
		{[]imageutils.ImageID{imageutils.Nginx, imageutils.NginxNew}, b.nginx},
		{[]imageutils.ImageID{imageutils.NonRoot}, func() images.Spec { s := b.base(); s.User = "1234"; return s }},
		{[]imageutils.ImageID{imageutils.Nonewprivs}, func() images.Spec {
			s := b.base()
			s.Files = append(s.Files, images.File{Path: "/usr/local/bin/nnp", Mode: 0o755 | os.ModeSetuid, Data: b.read(*nnp)})
			s.Env, s.Cmd = []string{images.BusyboxPATH + ":/usr/local/bin"}, []string{"nnp"}
			return s
		}},
		{[]imageutils.ImageID{imageutils.Pause}, func() images.Spec { return images.PauseImage(b.read(*pause)) }},
		{[]imageutils.ImageID{imageutils.APIServer}, func() images.Spec {
			return images.Spec{Files: []images.File{{Path: "/sample-apiserver", Mode: 0o755, Data: b.read(*sampleAPIServer)}},
				Entrypoint: []string{"/sample-apiserver"}}
		}},
		{[]imageutils.ImageID{imageutils.Etcd}, func() images.Spec {
			s := images.Spec{Files: b.hostBinary("/usr/bin/etcd", "/usr/local/bin/etcd"), Env: []string{images.BusyboxPATH + ":/usr/local/bin"}}
			s.Files = append(s.Files, images.File{Path: "/tmp", Mode: os.ModeDir | os.ModeSticky | 0o777})
			return s
		}},
	}
	for _, s := range specs {
		spec := s.spec()
		if b.err != nil {
			log.Fatal(b.err)
		}
		img, err := images.Build(spec)
		if err != nil {
			log.Fatal(err)
		}
		for _, id := range s.images {
			ref := imageutils.GetE2EImage(id)
			if err := write(img, ref, *out); err != nil {
				log.Fatal(err)
			}
			fmt.Println(ref)
		}
	}
}

// write saves img, named ref, as DIR/<name>-<tag>.tar.
func write(img v1.Image, ref, dir string) error {
	base := strings.NewReplacer("/", "_", ":", "-").Replace(ref[strings.Index(ref, "/")+1:])
	return images.WriteTarball(img, ref, filepath.Join(dir, base+".tar"))
}

// builder assembles image specs from host files; the first error sticks and stops the run.
type builder struct {
	busyboxPath, alpinePath string
	err                     error
}

func (b *builder) read(path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil && b.err == nil {
		b.err = err
	}
	return data
}

// busybox is the busybox image: the busybox binary with a link for each applet.
func (b *builder) busybox() images.Spec {
	spec, err := images.Busybox(b.busyboxPath)
	if err != nil && b.err == nil {
		b.err = err
	}
	return spec
}

// base is busybox plus the given host binaries (with their shared libraries), which replace busybox applets
// of the same name, and an /etc/passwd and /etc/group that also hold agnhost's user-defined-in-image (1000)
// and group-defined-in-image (50000).
func (b *builder) base(binaries ...string) images.Spec {
	return b.over(b.busybox(), binaries...)
}

// alpine is the Alpine Linux minirootfs as an image: its directories, files (setuid bits kept), symbolic
// links, and hard links as copies.
func (b *builder) alpine() images.Spec {
	files, err := rootfsFiles(b.alpinePath)
	if err != nil && b.err == nil {
		b.err = fmt.Errorf("the Alpine root filesystem: %w", err)
	}
	return images.Spec{Files: files, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Cmd: []string{"/bin/sh"}}
}

// rootfsFiles reads a root filesystem tarball (.tar.gz) into image files.
func rootfsFiles(path string) ([]images.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	var files []images.File
	data := map[string][]byte{} // regular files by path, for the hard links to them
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		name := filepath.Join("/", hdr.Name)
		if name == "/" {
			continue
		}
		perm := hdr.FileInfo().Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			files = append(files, images.File{Path: name, Mode: os.ModeDir | perm})
		case tar.TypeReg:
			content, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			data[name] = content
			files = append(files, images.File{Path: name, Mode: perm, Data: content})
		case tar.TypeSymlink:
			files = append(files, images.File{Path: name, Link: hdr.Linkname})
		case tar.TypeLink:
			target, ok := data[filepath.Join("/", hdr.Linkname)]
			if !ok {
				return nil, fmt.Errorf("%s: a hard link to %s, which comes later or not at all", name, hdr.Linkname)
			}
			files = append(files, images.File{Path: name, Mode: perm, Data: target})
		default:
			return nil, fmt.Errorf("%s: entries of type %q are not supported", name, hdr.Typeflag)
		}
	}
}

// over is spec plus the given host binaries (with their shared libraries), which replace the programs or
// busybox applets of the same name, and an /etc/passwd and /etc/group that also hold agnhost's
// user-defined-in-image (1000) and group-defined-in-image (50000).
func (b *builder) over(spec images.Spec, binaries ...string) images.Spec {
	host := map[string]bool{}
	var files []images.File
	for _, bin := range binaries {
		host[filepath.Base(bin)] = true
		files = append(files, b.hostBinary(bin, bin)...)
	}
	for _, f := range spec.Files {
		switch {
		case host[filepath.Base(f.Path)]:
			continue // the host's program instead of the applet
		case f.Path == "/etc/passwd":
			f.Data = append(f.Data, "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"...)
		case f.Path == "/etc/group":
			f.Data = append(f.Data, "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"...)
		}
		files = append(files, f)
	}
	// glibc's getent (the DNS tests resolve pods' /etc/hosts names with it, as upstream's images do with
	// musl's) reads /etc/hosts before DNS only when nsswitch.conf says so; without the file it asks DNS first
	// and stops at its "not found".
	files = append(files, images.File{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")})
	spec.Files = dedupe(files)
	return spec
}

// agnhost is the agnhost image: the base with agnhost's tools, the binary at /agnhost, and at / the key pair
// `agnhost porter` serves TLS with (from testImages/agnhost/porter, as upstream's image has them).
func (b *builder) agnhost(binary, testImages string, extra []images.File, cmd []string) images.Spec {
	porter := filepath.Join(testImages, "agnhost", "porter")
	extra = append(extra,
		images.File{Path: "/localhost.crt", Mode: 0o644, Data: b.read(filepath.Join(porter, "localhost.crt"))},
		images.File{Path: "/localhost.key", Mode: 0o644, Data: b.read(filepath.Join(porter, "localhost.key"))})
	spec := b.over(b.alpine(), "/usr/bin/dig", "/usr/bin/nslookup", "/usr/bin/host", "/usr/bin/curl", "/usr/bin/nc", "/usr/bin/getent")
	spec.Files = dedupe(append(spec.Files, append([]images.File{
		{Path: "/agnhost", Mode: 0o755, Data: b.read(binary)},
		{Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/uploads", Mode: os.ModeDir | 0o755},
	}, extra...)...))
	spec.Entrypoint = []string{"/agnhost"}
	spec.Cmd = []string{"pause"}
	if cmd != nil {
		spec.Cmd = cmd
	}
	return spec
}

// webPages is kitten or nautilus (name): agnhost serving the files of the image's html directory from /
// (test-webserver).
func (b *builder) webPages(binary, testImages, name string) images.Spec {
	dir := filepath.Join(testImages, name, "html")
	entries, err := os.ReadDir(dir)
	if err != nil && b.err == nil {
		b.err = err
	}
	var pages []images.File
	for _, e := range entries {
		pages = append(pages, images.File{Path: "/" + e.Name(), Mode: 0o644, Data: b.read(filepath.Join(dir, e.Name()))})
	}
	return b.agnhost(binary, testImages, pages, []string{"test-webserver"})
}

const nginxConf = `user root;
worker_processes 1;
pid /run/nginx.pid;
error_log stderr;
events { worker_connections 1024; }
http {
	include /etc/nginx/mime.types;
	access_log /dev/stdout;
	server {
		listen 80 default_server;
		listen [::]:80 default_server;
		root /usr/share/nginx/html;
		index index.html;
	}
}
`

// nginx is the host's nginx serving its default page on port 80, in the foreground.
func (b *builder) nginx() images.Spec {
	spec := b.base("/usr/sbin/nginx")
	spec.Files = dedupe(append(spec.Files,
		images.File{Path: "/etc/nginx/nginx.conf", Mode: 0o644, Data: []byte(nginxConf)},
		images.File{Path: "/etc/nginx/mime.types", Mode: 0o644, Data: b.read("/etc/nginx/mime.types")},
		images.File{Path: "/usr/share/nginx/html/index.html", Mode: 0o644, Data: b.read("/usr/share/nginx/html/index.html")},
		images.File{Path: "/var/lib/nginx", Mode: os.ModeDir | 0o755},
		images.File{Path: "/var/log/nginx", Mode: os.ModeDir | 0o755},
		images.File{Path: "/run", Mode: os.ModeDir | 0o755},
	))
	spec.Cmd = []string{"nginx", "-g", "daemon off;"}
	spec.StopSignal = "SIGQUIT"
	return spec
}

// lddLine matches the library paths ldd prints: "libc.so.6 => /lib/.../libc.so.6 (0x...)" and
// "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// hostBinary returns the host program at path, placed at dest in the image, and the shared libraries ldd
// says it loads, at the paths ldd resolved them to.
func (b *builder) hostBinary(path, dest string) []images.File {
	data := b.read(path)
	if b.err != nil {
		b.err = fmt.Errorf("%w (setup installs the conformance images' host packages)", b.err)
		return nil
	}
	files := []images.File{{Path: dest, Mode: 0o755, Data: data}}
	out, err := exec.Command("ldd", path).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return files
		}
		b.err = fmt.Errorf("ldd %s: %v: %s", path, err, out)
		return nil
	}
	for _, m := range lddLine.FindAllSubmatch(out, -1) {
		lib := string(m[1])
		files = append(files, images.File{Path: lib, Mode: 0o755, Data: b.read(lib)})
	}
	return files
}

// dedupe keeps the last file of each path, sorted by path.
func dedupe(files []images.File) []images.File {
	byPath := map[string]images.File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	out := make([]images.File, 0, len(byPath))
	for _, f := range byPath {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
