def test_emulator_serves_google_cloud_storage_and_gcsfs(gcs_emulator):
    import fsspec

    bucket = gcs_emulator.make_bucket()
    fs = fsspec.filesystem("gs", skip_instance_cache=True)
    fs.pipe_file(f"{bucket[5:]}/a/b.txt", b"hello")
    blob = gcs_emulator.client().bucket(bucket[5:]).blob("a/b.txt")
    assert blob.download_as_bytes() == b"hello"
