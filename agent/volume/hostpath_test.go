package volume

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

func TestHostPathTypes(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	chr, blk := "/dev/null", ""
	if os.Geteuid() == 0 {
		blk = filepath.Join(dir, "blk")
		if err := unix.Mknod(blk, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 200))); err != nil {
			t.Fatal(err)
		}
	}
	missing := filepath.Join(dir, "missing")

	tests := []struct {
		name    string
		path    string
		typ     corev1.HostPathType
		wantErr string
		check   func(t *testing.T)
	}{
		{name: "unset accepts anything, even missing", path: missing, typ: corev1.HostPathUnset},
		{name: "Directory", path: dir, typ: corev1.HostPathDirectory},
		{name: "Directory on a file", path: file, typ: corev1.HostPathDirectory, wantErr: "is not a directory"},
		{name: "Directory missing", path: missing, typ: corev1.HostPathDirectory, wantErr: "does not exist"},
		{name: "DirectoryOrCreate creates 0755", path: filepath.Join(dir, "new/deep"), typ: corev1.HostPathDirectoryOrCreate, check: func(t *testing.T) {
			if m := mode(t, filepath.Join(dir, "new/deep")); !m.IsDir() || m.Perm() != 0o755 {
				t.Errorf("created %v", m)
			}
		}},
		{name: "DirectoryOrCreate on a file", path: file, typ: corev1.HostPathDirectoryOrCreate, wantErr: "is not a directory"},
		{name: "File", path: file, typ: corev1.HostPathFile},
		{name: "File on a dir", path: dir, typ: corev1.HostPathFile, wantErr: "is not a file"},
		{name: "File on a socket", path: sock, typ: corev1.HostPathFile, wantErr: "is not a file"},
		{name: "FileOrCreate creates 0644", path: filepath.Join(dir, "created"), typ: corev1.HostPathFileOrCreate, check: func(t *testing.T) {
			if m := mode(t, filepath.Join(dir, "created")); !m.IsRegular() || m.Perm() != 0o644 {
				t.Errorf("created %v", m)
			}
		}},
		{name: "FileOrCreate keeps an existing file", path: file, typ: corev1.HostPathFileOrCreate},
		{name: "FileOrCreate needs the parent", path: filepath.Join(dir, "nodir/f"), typ: corev1.HostPathFileOrCreate, wantErr: "parent directory"},
		{name: "FileOrCreate on a dir", path: dir, typ: corev1.HostPathFileOrCreate, wantErr: "is not a file"},
		{name: "Socket", path: sock, typ: corev1.HostPathSocket},
		{name: "Socket on a file", path: file, typ: corev1.HostPathSocket, wantErr: "is not a socket"},
		{name: "CharDevice", path: chr, typ: corev1.HostPathCharDev},
		{name: "CharDevice on a file", path: file, typ: corev1.HostPathCharDev, wantErr: "is not a character device"},
		{name: "BlockDevice", path: blk, typ: corev1.HostPathBlockDev},
		{name: "BlockDevice on a char device", path: chr, typ: corev1.HostPathBlockDev, wantErr: "is not a block device"},
		{name: "unknown type", path: dir, typ: "Fifo", wantErr: "unknown hostPath type"},
		{name: "relative path", path: "var/log", typ: corev1.HostPathUnset, wantErr: "must be absolute"},
		{name: "path with ..", path: dir + "/../x", typ: corev1.HostPathUnset, wantErr: `must not contain ".."`},
	}
	// A strict umask must not change the modes kubelet documents.
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.path == "" {
				t.Skip("skipping: making a block device needs root")
			}
			pod := testPod(corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: tt.path, Type: ptr(tt.typ)}}})
			vol, err := setupHostPath(pod, &pod.Spec.Volumes[0])
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if !strings.HasPrefix(err.Error(), `pod default/web: volume "host": hostPath "`+tt.path+`" (type "`+string(tt.typ)+`"): `) {
					t.Errorf("error %q does not name the pod, volume, path and type", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if vol.Path != filepath.Clean(tt.path) || vol.Kind != KindHostPath || vol.ReadOnly {
				t.Errorf("volume %+v", vol)
			}
			if tt.check != nil {
				tt.check(t)
			}
		})
	}
}
