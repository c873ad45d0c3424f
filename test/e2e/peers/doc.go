// Package peers prepares the other storage provisioners that issue 72's
// comparison runs beside converge in the e2e cluster, as their docs
// install them. So far that is rancher's local-path-provisioner: its
// release's manifest (../localpath/local-path-storage.yaml), changed only
// where the run must differ (LocalPath), and the names under which the
// manifest asks for its images.
package peers
